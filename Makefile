# Entry points. Each target sets up .venv first (scripts/setup_dev.sh, idempotent).
PY := .venv/bin/python

.PHONY: help setup test demo dry-run lint e2e e2e-setup

help:
	@echo "make demo     run a few GRPO steps of the Qwen2.5 recipe on CPU (tiny model; patched verl 0.6.0)"
	@echo "make test     run the test suite (what CI runs)"
	@echo "make e2e      the recipe's real launch path on CPU: main_ppo + vLLM CPU build, sync/async/resume"
	@echo "make e2e-setup  build the e2e environment (vLLM 0.13.0 CPU build, torch 2.9.1; ~7 GB, once per machine)"
	@echo "make dry-run  fetch + patch verl, check the single-card launcher's overrides, print the command"
	@echo "make setup    create .venv with the CPU tool/test environment"
	@echo "make lint     ruff over the repository"

setup:
	@bash scripts/setup_dev.sh

test: setup
	$(PY) -m pytest

demo: setup
	$(PY) scripts/demo_grpo.py

e2e-setup: setup
	@bash scripts/setup_e2e.sh

# E2E_ARGS passes options to scripts/e2e.py (e.g. E2E_ARGS="--runs sync").
e2e: e2e-setup
	.venv-e2e/bin/python scripts/e2e.py $(E2E_ARGS)

dry-run: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" bash llm_rl/qwen2_5/run_qwen2_5_1_5b_single.sh --dry-run

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
