#!/usr/bin/env bash
# Qwen2.5-1.5B-Instruct GRPO on MATH-lighteval on ONE Atlas A2 card (cann-recipes-train's guide, 7.4).
#
#   bash run_qwen2_5_1_5b_single.sh [--base VERSION] [--dry-run [--json]] [--cpu] [--help] [override ...]
#
# The same run as run_qwen2_5_1_5b.sh with NPUS=1 (trainer.n_gpus_per_node=1, rollout TP 1,
# card 0 unless ASCEND_RT_VISIBLE_DEVICES says otherwise); see that script for the paths.
# --base VERSION (or VERL_BASE=): the verl base (0.6.0 or 0.7.1; default recipe.toml's default_base).
# --cpu (or PROFILE=cpu): the same launch on a machine with no NPU (cpu_profile.sh; make e2e).
# --json: the dry run's plan as one JSON object on stdout (implies --dry-run).
set -euo pipefail
case " $* " in *" --help "*|*" -h "*) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
NPUS=1 RUN_NAME="${RUN_NAME:-qwen2_5_1_5b_math_single}" \
  exec bash "$(dirname "${BASH_SOURCE[0]}")/run_qwen2_5_1_5b.sh" "$@"
