#!/usr/bin/env bash
# Apply a recipe's verl patches the way the original repository's users are used to:
#   bash scripts/apply_patches.sh qwen2_5                     # fetch the default base's verl if needed, then apply
#   bash scripts/apply_patches.sh qwen2_5 --base 0.6.0        # another verl base of the recipe
#   bash scripts/apply_patches.sh qwen2_5 --target ~/verl      # onto a verl tree you already have
#   bash scripts/apply_patches.sh qwen2_5 --dry-run            # check only
#   bash scripts/apply_patches.sh qwen2_5 --revert [--target DIR]
# A thin wrapper over `python3 -m ascend_rl overlay` (see its --help); exit 0 done, 1 refused, 2 usage.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"

if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -eq 0 ] && exit 2 || exit 0
fi

recipe="$1"; shift
action=apply
args=()
for arg in "$@"; do
  case "$arg" in
    --revert) action=revert ;;
    *) args+=("$arg") ;;
  esac
done

# The overlay command parses every option before it fetches anything: `apply --fetch` fetches the
# recipe's own tree (llm_rl/<recipe>/verl-<base>) only when no --target is given and it is absent.
[ "$action" = apply ] && args+=(--fetch)
PYTHONPATH="$(dirname "$here")${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m ascend_rl overlay "$action" "$recipe" ${args[@]+"${args[@]}"}
