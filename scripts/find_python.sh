# shellcheck shell=bash
# Sourced by the recipe launchers (REPO_DIR set): PYTHON becomes the interpreter that has verl's
# dependencies (hydra-core, omegaconf), so a launcher runs from a fresh shell without a traceback.
#
# Order: PYTHON from the environment (it must have them); python3 on PATH (on the NPU host the
# stack's Python, or any activated environment); the CPU profile's .venv-e2e (make e2e-setup; .venv-e2e-091 for
# verl 0.9.1: scripts/setup_e2e.sh --base 0.9.1), by VERL_BASE, else by the default_base of the recipe.toml given as
# the second argument; the repository's .venv (make setup, the CPU tool environment). None of them: one line, exit 1.
recipes_find_python() {
  local who="$1" recipe_toml="${2:-}" base="${VERL_BASE:-}" candidate on_path
  # no base named: the recipe's default (the key ascend_rl.manifest reads; tests/launch/test_preflight.py holds them equal)
  if [ -z "$base" ] && [ -n "$recipe_toml" ]; then
    base="$(sed -n 's/^default_base *= *"\([^"]*\)".*/\1/p' "$recipe_toml" | head -n 1)"
  fi
  if [ -n "${PYTHON:-}" ]; then
    # a path relative to where the command runs (the node lines' PYTHON=.venv/bin/python3, from the repository
    # root), made absolute before any cd
    case "$PYTHON" in /*) ;; */*) PYTHON="$PWD/$PYTHON" ;; esac
    if "$PYTHON" -c 'import hydra, omegaconf' 2>/dev/null; then return 0; fi
    echo "$who: PYTHON=$PYTHON cannot import hydra and omegaconf (verl's config stack); unset PYTHON or point it at the environment the stack is installed in" >&2
    return 1
  fi
  on_path="$(command -v python3 || true)"
  local candidates=("$on_path")
  # the CPU profile's stack: verl 0.9.1 runs on vLLM 0.23.0 (.venv-e2e-091), the other bases on 0.13.0 (.venv-e2e)
  [ "${PROFILE:-npu}" != cpu ] || candidates+=("$REPO_DIR/.venv-e2e$([ "$base" != 0.9.1 ] || echo -091)/bin/python")
  candidates+=("$REPO_DIR/.venv/bin/python")
  for candidate in "${candidates[@]}"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    if "$candidate" -c 'import hydra, omegaconf' 2>/dev/null; then
      PYTHON="$candidate"
      return 0
    fi
  done
  echo "$who: no Python with verl's dependencies (python3 on PATH is ${on_path:-absent} and cannot import hydra); on the NPU host activate the environment scripts/install_npu_stack.sh installed into, on a CPU box run \`make setup\` (it creates .venv, found automatically), or set PYTHON=/path/to/python" >&2
  return 1
}
