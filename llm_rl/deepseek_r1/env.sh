# shellcheck shell=bash
# Environment shared by ray_start.sh (every node) and run_deepseek_r1_a3.sh (head): the CANN
# toolkit when present and the seed's vLLM / allocator / HCCL settings. Sourced, not run.
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then
  # shellcheck disable=SC1091
  set +u; source /usr/local/Ascend/ascend-toolkit/set_env.sh; set -u
fi
export VLLM_ASCEND_ENABLE_NZ="${VLLM_ASCEND_ENABLE_NZ:-0}"
export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-max_split_size_mb:512}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-3600}"
# named for the launcher's dry-run plan (run_deepseek_r1_a3.sh)
LAUNCH_ENV+=(VLLM_ASCEND_ENABLE_NZ PYTORCH_NPU_ALLOC_CONF OMP_NUM_THREADS HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT)
# What depends on the base, once ray_start.sh / the launcher have resolved it (VERL_BASE: `ascend_rl resolve`):
# VLLM_USE_V1=1 only for vLLM 0.13 (the 0.6.0 and 0.7.1 bases); vLLM 0.23 (0.9.1) has no such variable, V1 is its engine.
recipes_base_env() {
  case "$VERL_BASE" in 0.6.0|0.7.1) export VLLM_USE_V1=1; LAUNCH_ENV+=(VLLM_USE_V1) ;; esac
}
