#!/usr/bin/env bash
# Qwen2.5-1.5B-Instruct GRPO on MATH-lighteval on ONE Atlas A2 card (cann-recipes-train's guide, 7.4).
#
#   bash run_qwen2_5_1_5b_single.sh [--base VERSION] [--dry-run [--json]] [--cpu] [--help] [override ...]
#
# The same run as run_qwen2_5_1_5b.sh with NPUS=1 (trainer.n_gpus_per_node=1, rollout TP 1,
# card 0 unless ASCEND_RT_VISIBLE_DEVICES says otherwise); see that script for the paths. NPUS, when set,
# must be 1: any other value is refused (exit 2).
# --base VERSION (or VERL_BASE=): the verl base (0.9.1, 0.7.1 or 0.6.0; default recipe.toml's default_base, 0.9.1).
# --cpu (or PROFILE=cpu): the same launch on a machine with no NPU (cpu_profile.sh; make e2e).
# --json: the dry run's plan as one JSON object on stdout (implies --dry-run).
set -euo pipefail
case " $* " in *" --help "*|*" -h "*) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
# One card: NPUS unset or 1. Any other value is refused (as run_qwen2_5_1_5b.sh refuses a value that is no
# card count), never run as one card.
case "${NPUS:-1}" in
  *[!0-9]*) npus_ok=no ;;
  *) npus_ok=$((10#${NPUS:-1})) ;;
esac
case "$npus_ok" in
  1) ;;
  no|0) echo "$(basename "$0"): NPUS must be a card count (1, 4, ...), not '$NPUS'" >&2; exit 2 ;;
  *) echo "$(basename "$0"): NPUS must be 1 on this one-card launcher, not '$NPUS'; for $npus_ok cards run run_qwen2_5_1_5b.sh" >&2; exit 2 ;;
esac
# its usage errors name this script (RECIPES_LAUNCHER), not the one it runs
NPUS=1 RUN_NAME="${RUN_NAME:-qwen2_5_1_5b_math_single}" RECIPES_LAUNCHER="$(basename "$0")" \
  exec bash "$(dirname "${BASH_SOURCE[0]}")/run_qwen2_5_1_5b.sh" "$@"
