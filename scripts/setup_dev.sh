#!/usr/bin/env bash
# Set up the CPU environment the tools, tests and the demo run in: .venv with
# requirements-dev.txt (stack versions taken from constraints.txt) and verl from the
# pinned source distribution, installed --no-deps, and this repository's package (ascend_rl) with
# pip install -e . (its commands: .venv/bin/ascend-rl --help). Idempotent: a second run with
# unchanged requirements returns at once.
#   bash scripts/setup_dev.sh            # or: make setup
#   PYTHON=python3.11 bash scripts/setup_dev.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup_dev.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "setup_dev.sh: $PYTHON is older than 3.11; set PYTHON=python3.11" >&2; exit 1; }

stamp="$VENV/.recipes-setup"
want=$(cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml llm_rl/qwen2_5/recipe.toml | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup: $VENV is up to date"
  exit 0
fi

setup_start=$SECONDS
[ -x "$VENV/bin/python" ] || { echo "setup: creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PY="$VENV/bin/python"
# The CPU-safe part of the stack pins: torch/torch_npu/vllm stay NPU-host only.
cpu_pins=$(mktemp)
log=$(mktemp)
trap 'rm -f "$cpu_pins" "$log"' EXIT
# Each pip step runs quietly into $log with a line every 30 s (how long, how big .venv is): scripts/step.sh.
# shellcheck disable=SC2034  # read by scripts/step.sh
STEP_TAG=setup STEP_DIR=$VENV STEP_LOG=$log
# shellcheck source=scripts/step.sh
source scripts/step.sh
pip_install() { step "$1" "$PY" -m pip install -q --disable-pip-version-check "${@:2}"; }
grep -E '^(transformers|ray|sympy)==' constraints.txt > "$cpu_pins"
pip_install "installing requirements-dev.txt (~1.9 GB, a few minutes the first time)" -r requirements-dev.txt -c "$cpu_pins"

sdist=$("$PY" - <<'PY'
import sys, tomllib
from ascend_rl import artifacts
# verl 0.6.0, whatever the recipe's default base: the in-process harness and the tests that import verl
# from the environment (not from a patched tree on PYTHONPATH) are written against it
pin = tomllib.load(open("llm_rl/qwen2_5/recipe.toml", "rb"))["bases"]["0.6.0"]
print(artifacts.verl_sdist("0.6.0", pin["sdist_sha256"]))
PY
)
pip_install "installing verl from $(basename "$sdist") (--no-deps)" --no-deps --force-reinstall "$sdist"
pip_install "installing this repository's package (ascend_rl, editable)" --no-deps -e .
"$PY" -c 'import verl, torch, transformers; print(f"setup: verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
echo "$want" > "$stamp"
echo "setup: done in $((SECONDS - setup_start)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
