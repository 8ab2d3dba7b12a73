#!/usr/bin/env bash
# Qwen2.5-1.5B-Instruct GRPO on MATH-lighteval on ONE Atlas A2 card (cann-recipes-train's guide, 7.4).
#
#   bash run_qwen2_5_1_5b_single.sh [--dry-run [--json]] [--cpu] [--help] [hydra.override=value ...]
#
# The same run as run_qwen2_5_1_5b.sh with NPUS=1 (trainer.n_gpus_per_node=1, rollout TP 1,
# card 0 unless ASCEND_RT_VISIBLE_DEVICES says otherwise); see that script for the paths.
# --cpu (or PROFILE=cpu): the same launch on a machine with no NPU (cpu_profile.sh; make e2e).
# --json: the dry run's plan as one JSON object on stdout (implies --dry-run).
set -euo pipefail
case " $* " in *" --help "*|*" -h "*) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
NPUS=1 RUN_NAME="${RUN_NAME:-qwen2_5_1_5b_math_single}" \
  exec bash "$(dirname "${BASH_SOURCE[0]}")/run_qwen2_5_1_5b.sh" "$@"
