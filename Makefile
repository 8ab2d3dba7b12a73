# Entry points. Each target sets up .venv first (scripts/setup_dev.sh, idempotent).
PY := .venv/bin/python

.PHONY: help setup test test-full demo dry-run lint e2e e2e-setup e2e-setup-091

help:
	@echo "make demo     GRPO through the recipe's launcher, main_ppo and vLLM on CPU on the default base (verl 0.9.1): a tiny model learns, held-out before/after"
	@echo "make test     the test suite's CI tier: every test, each recipe's default launch once, one negative control, one kill per recipe, the 2-node join (budget 30 min fresh)"
	@echo "make test-full  the whole matrix: every e2e run on every base, every negative control, the fault plan; ends with a table"
	@echo "make e2e      the recipes' real launch paths on CPU: main_ppo + vLLM CPU build, Qwen on verl 0.9.1 (default), 0.7.1 and 0.6.0 with resume and 2 ranks, DeepSeek (Megatron) on verl 0.9.1 (default, its engine workers), 0.7.1 and 0.6.0 (+ --runs deepseek-2n,deepseek-v071-2n,deepseek-v091-2n: 2 simulated nodes, root)"
	@echo "make e2e-setup  build the e2e environment (vLLM 0.13.0 CPU build, torch 2.9.1; 8.4 GB on disk, 4.3 GB of it CUDA libraries PyPI's torch brings; once per machine)"
	@echo "make e2e-setup-091  build verl 0.9.1's e2e environment (vLLM 0.23.0 CPU build, torch 2.11.0, transformers 5.5.4, Python 3.12; 6.7 GB; once per machine): make e2e E2E_ARGS=\"--runs v091,v091-resume\""
	@echo "make dry-run  fetch + patch verl, check the single-card launcher's overrides, print the command"
	@echo "make setup    create .venv with the CPU tool/test environment"
	@echo "make lint     ruff over the repository"

setup:
	@bash scripts/setup_dev.sh

# Two pytest workers (pytest-xdist), each given whole files, the longest first (tests/conftest.py). A test's tier
# is a marker in its own file: make test runs `-m "not full"`, make test-full everything (CONTRIBUTING.md).
# Both set up .venv and the e2e environment first and end with the set-up and test times (scripts/run_tests.sh).
# TEST_WORKERS=0 runs in one process; PYTEST_ARGS adds pytest options.
test:
	@bash scripts/run_tests.sh ci

test-full:
	@bash scripts/run_tests.sh full

# DEMO_ARGS passes options to ascend_rl/harness/demo.py (e.g. DEMO_ARGS="--steps 8"). The harness runs in .venv-e2e
# (it makes the inputs) and hands the launcher the default base's stack, verl 0.9.1's .venv-e2e-091.
demo: e2e-setup e2e-setup-091
	.venv-e2e/bin/python -m ascend_rl demo $(DEMO_ARGS)

e2e-setup: setup
	@bash scripts/setup_e2e.sh

# verl 0.9.1's stack is a second environment, built with Python 3.12 (python3.12 on PATH, else pyenv's; PYTHON= to pick one).
e2e-setup-091: setup
	@bash scripts/setup_e2e.sh --base 0.9.1

# E2E_ARGS passes options to ascend_rl/harness/e2e.py (e.g. E2E_ARGS="--runs sync"); its verl 0.9.1 runs (both
# recipes' default base: v091 and deepseek-v091, with their resume, ranks and nodes) run in .venv-e2e-091.
e2e: e2e-setup e2e-setup-091
	.venv-e2e/bin/python -m ascend_rl e2e $(E2E_ARGS)

dry-run: setup
	PATH="$(CURDIR)/.venv/bin:$$PATH" bash llm_rl/qwen2_5/run_qwen2_5_1_5b_single.sh --dry-run

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
