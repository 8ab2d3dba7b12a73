#!/usr/bin/env bash
# Qwen2.5-1.5B-Instruct GRPO on MATH-lighteval, one Atlas A2 node (4 cards by default).
#
#   bash run_qwen2_5_1_5b.sh [--base VERSION] [--dry-run [--json]] [--cpu] [--help] [hydra.override=value ...]
#
# --base VERSION (or VERL_BASE=VERSION): the verl base, 0.9.1 (today's stack: vLLM / vllm-ascend 0.23, the engine
# workers), 0.7.1 (verl's own Ascend release for vLLM 0.13, server-mode rollout) or 0.6.0 (the original guide's
# sync rollout); default: recipe.toml's default_base (0.9.1).
# Paths: MODEL_DIR (default model/Qwen2_5_1_5B_Instruct), DATA_DIR (default data/math,
# holding train.parquet and test.parquet), VERL_DIR (default verl-<base>/, fetched and patched
# by the overlay tool), LOG_DIR (default run_log/), CKPT_DIR (default checkpoints/),
# all relative to this folder. NPUS (default 4) sets the card count; run_qwen2_5_1_5b_single.sh
# is this script with NPUS=1. Extra arguments are Hydra overrides and win over the list below.
# --cpu (or PROFILE=cpu) runs the same launch on a machine with no NPU: cpu_profile.sh says what
# it changes (tiny model from e2e_out/, small batches, the verl-<base>-cpu tree, vLLM's CPU build); NPUS there
# is the number of trainer processes (FSDP2 ranks on gloo), each with a vLLM engine of its own.
# --json: the dry run prints its plan as one JSON object on stdout (trainer argv, final overrides, verl
# tree and base, environment), the report on stderr; it implies --dry-run.
# A rerun of the same RUN_NAME resumes from its newest complete checkpoint (trainer.resume_mode=auto;
# patch shared-0012 makes a save killed half-way harmless). A run that fails ends with one line naming
# what died (a trainer rank, the vLLM server, a reward worker), in which step and phase (run_failure.py).
set -euo pipefail

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$RECIPE_DIR/../.." && pwd)"
# the name a usage error gives: run_qwen2_5_1_5b_single.sh runs this script and names itself (RECIPES_LAUNCHER)
ME="${RECIPES_LAUNCHER:-$(basename "$0")}"
unset RECIPES_LAUNCHER
# shellcheck source=../../scripts/launcher_options.sh
source "$REPO_DIR/scripts/launcher_options.sh"
NPUS="${NPUS:-4}"
RUN_NAME="${RUN_NAME:-qwen2_5_1_5b_math_${NPUS}npu}"
# The model and data folders the user left to this script (read before it or its CPU profile sets them): a dry run
# on a machine that has not prepared them warns; an absent folder the user named fails it, as it fails a launch.
ABSENT_OK=()
[ -n "${MODEL_DIR:-}" ] || ABSENT_OK+=(MODEL_DIR)
[ -n "${DATA_DIR:-}" ] || ABSENT_OK+=(DATA_DIR)

PROFILE="${PROFILE:-npu}"
DRY_RUN=()
JSON=()
LAUNCH_ENV=()
ARGS=()
VERL_BASE="${VERL_BASE:-}"
while [ "$#" -gt 0 ]; do
  arg="$1"; shift
  case "$arg" in
    --dry-run) DRY_RUN=(--dry-run) ;;
    --json) DRY_RUN=(--dry-run); JSON=(--json) ;;
    --cpu) PROFILE=cpu ;;
    --base=*) VERL_BASE="${arg#--base=}" ;;
    --base)
      [ "$#" -gt 0 ] || { echo "$ME: --base needs a version (e.g. --base 0.7.1)" >&2; exit 2; }
      VERL_BASE="$1"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    --*=*|--[a-z]*) recipes_unknown_option "$ME" "$arg" --dry-run --json --cpu --base --help; exit 2 ;;
    *) ARGS+=("$arg") ;;
  esac
done
# A card count: digits, not zero however written (00 too); run_qwen2_5_1_5b_single.sh refuses the same way.
# Checked before the profiles: the CPU profile sizes its trainer ranks by it.
case "$NPUS" in ''|*[!0-9]*) npus_count=0 ;; *) npus_count=$((10#$NPUS)) ;; esac
[ "$npus_count" -gt 0 ] || { echo "$ME: NPUS must be a card count (1, 4, ...), not '$NPUS'" >&2; exit 2; }
case "$PROFILE" in
  npu|cpu) ;;
  *) echo "$ME: PROFILE must be npu or cpu, not '$PROFILE'" >&2; exit 2 ;;
esac

if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then
  # shellcheck disable=SC1091
  set +u; source /usr/local/Ascend/ascend-toolkit/set_env.sh; set -u
fi
# shellcheck source=../../scripts/find_python.sh
source "$REPO_DIR/scripts/find_python.sh"
recipes_find_python "$ME" "$RECIPE_DIR/recipe.toml" || exit 1
# The base (--base / VERL_BASE, else recipe.toml's default_base) and what it needs, resolved once by the manifest
# reader: VERL_BASE, RECIPE_TREE (the default verl tree), BASE_OVERRIDES, BASE_CPU_OVERRIDES, BASE_CPU_ENV,
# RECIPE_DIE, RECIPE_REWARD and RECIPE_REWARD_FN (the reward file and function of recipe.toml's [reward]).
# An unknown base: one line, exit 2 (python3 -m ascend_rl resolve --help).
resolved="$(cd "$REPO_DIR" && "$PYTHON" -m ascend_rl resolve qwen2_5 --base "$VERL_BASE" --profile "$PROFILE" --shell)" \
  || exit 2
eval "$resolved"
case "$PROFILE" in
  npu) CPU_OVERRIDES=(); PREFLIGHT_PROFILE=() ;;
  cpu)
    # shellcheck source=cpu_profile.sh
    source "$RECIPE_DIR/cpu_profile.sh" ;;
esac

# The environment of cann-recipes-train's guide (vLLM V1 engine, no FRACTAL_NZ weights, allocator split size).
# VLLM_USE_V1 only for vLLM 0.13 (the 0.6.0 and 0.7.1 bases): vLLM 0.23 (0.9.1) has no such variable, V1 is its engine.
case "$VERL_BASE" in 0.6.0|0.7.1) export VLLM_USE_V1=1; LAUNCH_ENV+=(VLLM_USE_V1) ;; esac
export VLLM_ASCEND_ENABLE_NZ=0
export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-max_split_size_mb:512}"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-max_split_size_mb:512}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1500}"
export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-1800}"
export HCCL_HOST_SOCKET_PORT_RANGE="${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}"
export HCCL_NPU_SOCKET_PORT_RANGE="${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}"
export ASCEND_GLOBAL_LOG_LEVEL="${ASCEND_GLOBAL_LOG_LEVEL:-3}"
if [ -z "${ASCEND_RT_VISIBLE_DEVICES:-}" ]; then
  ASCEND_RT_VISIBLE_DEVICES="$(seq -s, 0 $((NPUS - 1)))"
fi
export ASCEND_RT_VISIBLE_DEVICES

VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"
MODEL_DIR="${MODEL_DIR:-$RECIPE_DIR/model/Qwen2_5_1_5B_Instruct}"
DATA_DIR="${DATA_DIR:-$RECIPE_DIR/data/math}"
LOG_DIR="${LOG_DIR:-$RECIPE_DIR/run_log}"
CKPT_DIR="${CKPT_DIR:-$RECIPE_DIR/checkpoints}"
# Metrics backends (verl's trainer.logger): console and TensorBoard by default, which need no account.
# LOGGER=console,wandb (or swanlab, mlflow; comma-separated) picks others; their files live next to the run log.
LOGGER="${LOGGER:-console,tensorboard}"
export TENSORBOARD_DIR="${TENSORBOARD_DIR:-$LOG_DIR/tensorboard/$RUN_NAME}"
export SWANLAB_LOG_DIR="${SWANLAB_LOG_DIR:-$LOG_DIR/swanlog}"
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$LOG_DIR/mlruns.db}"
export WANDB_DIR="${WANDB_DIR:-$LOG_DIR}"
# verl's file logger (LOGGER=...,file) writes <project>/<run>.jsonl under this folder, not the working directory.
export VERL_FILE_LOGGER_ROOT="${VERL_FILE_LOGGER_ROOT:-$LOG_DIR}"
# What this launcher exports for the trainer, named for the dry run's plan (with their values); PYTHONPATH
# is set just before the trainer starts.
LAUNCH_ENV+=(VLLM_ASCEND_ENABLE_NZ PYTORCH_NPU_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF OMP_NUM_THREADS
  HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT HCCL_HOST_SOCKET_PORT_RANGE HCCL_NPU_SOCKET_PORT_RANGE
  ASCEND_GLOBAL_LOG_LEVEL ASCEND_RT_VISIBLE_DEVICES TENSORBOARD_DIR SWANLAB_LOG_DIR MLFLOW_TRACKING_URI WANDB_DIR
  VERL_FILE_LOGGER_ROOT RECIPES_SHM_RECORD)  # the last: set by a real launch only (/dev/shm record, below)
TRAINER_PYTHONPATH="$VERL_DIR${PYTHONPATH:+:$PYTHONPATH}"

# The single-card baseline of cann-recipes-train's Qwen2.5 GRPO guide (section 7.4, its training
# script); micro-batches sized for 1.5B on a 64 GB card.
OVERRIDES=(
  algorithm.adv_estimator=grpo
  data.train_files="$DATA_DIR/train.parquet"
  data.val_files="$DATA_DIR/test.parquet"
  data.train_batch_size=256
  data.max_prompt_length=512
  data.max_response_length=1024
  data.filter_overlong_prompts=True
  data.truncation=error
  # the reward file and function recipe.toml's [reward] names (resolved above)
  custom_reward_function.path="$RECIPE_REWARD"
  custom_reward_function.name="$RECIPE_REWARD_FN"
  actor_rollout_ref.model.path="$MODEL_DIR"
  actor_rollout_ref.model.use_shm=False
  actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.optim.lr_warmup_steps=10
  actor_rollout_ref.actor.ppo_mini_batch_size=256
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.ref.fsdp_config.param_offload=True
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.8
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.enforce_eager=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
  algorithm.use_kl_in_reward=False
  trainer.device=npu
  trainer.nnodes=1
  trainer.n_gpus_per_node="$NPUS"
  trainer.total_epochs=5
  trainer.save_freq=70
  trainer.test_freq=10
  trainer.val_before_train=True
  "trainer.logger=[$LOGGER]"
  # A rerun of the same RUN_NAME resumes from its latest checkpoint (trainer.resume_mode=disable starts
  # afresh); the two newest checkpoints are kept (about 18 GB each with the optimizer state).
  trainer.resume_mode=auto
  trainer.max_actor_ckpt_to_keep=2
  trainer.project_name=verl_grpo_qwen2_5_math
  trainer.experiment_name="$RUN_NAME"
  trainer.default_local_dir="$CKPT_DIR/$RUN_NAME"
)

OVERRIDES+=("${BASE_OVERRIDES[@]}" "${CPU_OVERRIDES[@]}")

PREFLIGHT_PATHS=()
for name in "${ABSENT_OK[@]}"; do PREFLIGHT_PATHS+=(--may-be-absent "${!name}"); done

cd "$REPO_DIR"
"$PYTHON" -m ascend_rl preflight --recipe qwen2_5 --base "$VERL_BASE" --verl-dir "$VERL_DIR" "${PREFLIGHT_PROFILE[@]}" \
  --tokenizer-config "$RECIPE_DIR/tokenizer_config.json" "${DRY_RUN[@]}" "${JSON[@]}" "${PREFLIGHT_PATHS[@]}" \
  "${LAUNCH_ENV[@]/#/--env=}" --env="PYTHONPATH=$TRAINER_PYTHONPATH" \
  -- "${OVERRIDES[@]}" "${ARGS[@]}"
[ "${#DRY_RUN[@]}" -eq 0 ] || exit 0

# /dev/shm: first remove what an earlier run of these launchers left on this node when it was killed (its processes
# recorded each name as they made it; a name goes only once its creator has ended and no process maps it), then
# record this run's names the same way (ascend_rl/shm_record/). The harness records its runs itself.
if [ -z "${RECIPES_SHM_RECORD:-}" ]; then
  (cd "$REPO_DIR" && "$PYTHON" -m ascend_rl shm clean) || true
  SHM_RECORDS="${RECIPES_SHM_RECORDS:-${RECIPES_CACHE:-$HOME/.cache/ascend-rl-recipes}/shm}"
  RECIPES_SHM_RECORD="$SHM_RECORDS/{host}/${RUN_NAME}_$(date +%Y%m%d_%H%M%S)_$$.jsonl"
  export RECIPES_SHM_RECORD
  TRAINER_PYTHONPATH="$REPO_DIR/ascend_rl/shm_record:$TRAINER_PYTHONPATH"
fi
export PYTHONPATH="$TRAINER_PYTHONPATH"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/${RUN_NAME}_$(date +%Y%m%d_%H%M%S).log"
echo "logging to $LOG"
cd "$RECIPE_DIR"
rc=0  # (set -e would end the script at a failed pipeline; pipefail makes rc main_ppo's status)
"$PYTHON" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "${ARGS[@]}" 2>&1 | tee "$LOG" || rc=$?
# A failed run ends with one line saying what died (a trainer rank, the vLLM server, ...), in which step and phase
[ "$rc" -eq 0 ] || (cd "$REPO_DIR" && "$PYTHON" -m ascend_rl run_failure "$LOG") || true
exit "$rc"
