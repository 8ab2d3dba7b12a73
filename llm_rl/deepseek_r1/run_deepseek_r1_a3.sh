#!/usr/bin/env bash
# DeepSeek-R1 GRPO on a 128-card Atlas A3 SuperPoD (16 nodes x 16 dies), Megatron + MindSpeed
# training, vLLM-Ascend rollout. Run on the head node once ray_start.sh has run on every node.
#
#   bash run_deepseek_r1_a3.sh [--variant real|random] [--base VERSION] [--dry-run [--json]] [--cpu] [--help]
#                              [hydra.override=value ...]
#
# --base VERSION (or VERL_BASE=VERSION): the verl base, 0.9.1 (today's stack, the engine workers: every optimisation
# ported, its CPU runs pass, no NPU run yet), 0.7.1 (verl's own release for vLLM 0.13: the server-mode rollout) or
# 0.6.0 (the sync rollout, every optimisation, the longer record); default: recipe.toml's default_base, 0.9.1. While
# a base's series lacks a port an NPU launch needs, the launch is refused in one line naming it (--dry-run and
# --cpu go on).
# real   (default): BF16 weights from MODEL_DIR, Megatron shards from MCORE_DIR; rollout TP2 x DP64 = EP128
# random: random-initialised weights from MODEL_DIR's config.json only; rollout TP2 x DP128 = EP256 (on 0.9.1, whose
# engine always loads a checkpoint: a random one of that config, written once under RANDOM_MODEL_DIR, default
# model/random/, and reused; a dry run writes nothing)
# Paths: MODEL_DIR (default model/DeepSeek-R1-bf16), MCORE_DIR (model/DeepSeek-R1-mcore), DATA_DIR
# (data/deepscaler), VERL_DIR (verl-<base>/), LOG_DIR (run_log/), CKPT_DIR (checkpoints/), all under this
# folder. NNODES (16) and NPUS_PER_NODE (16) size the cluster. --dry-run composes every override
# against verl's ppo_megatron_trainer and prints the node-by-node commands. --cpu (or PROFILE=cpu): the same
# launch on one machine with no NPU, two processes (cpu_profile.sh says what it changes); with NNODES=N (N > 1)
# the same ranks across N CPU nodes on which `ray_start.sh --cpu` has run (docs/deepseek_r1-evidence.md: "Try the
# multi-node launch on one machine"). --json: the dry run prints its plan as one JSON object on stdout (trainer argv, final overrides,
# verl tree and base, environment), the report and the node-by-node commands on stderr; it implies --dry-run.
# A rerun of the same RUN_NAME resumes from its newest complete checkpoint (trainer.resume_mode=auto;
# patch shared-0012 makes a save killed half-way harmless). A run that fails ends with one line naming
# what died (a trainer rank, the vLLM server, a reward worker, a node), in which step and phase (run_failure.py).
# Across nodes (NNODES > 1) it refuses a trainer.default_local_dir not every node sees, and a watch ends a run
# whose placement group stays pending for RAY_PENDING_TIMEOUT seconds (600) or that lost a node (docs/cluster.md).
set -euo pipefail

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$RECIPE_DIR/../.." && pwd)"
# shellcheck source=../../scripts/launcher_options.sh
source "$REPO_DIR/scripts/launcher_options.sh"
# What the user set in the environment that decides what runs (read before this script sets any of them): the dry
# run's node-by-node commands carry each, so a line copied onto its node runs what this dry run checked.
NODE_ENV=()
for name in SOCKET_IFNAME VERL_DIR MODEL_DIR MCORE_DIR RANDOM_MODEL_DIR DATA_DIR LOG_DIR CKPT_DIR RUN_NAME LOGGER \
  RAY_PENDING_TIMEOUT RAY_WAIT_TIMEOUT RAY_WATCH; do
  [ -z "${!name+x}" ] || NODE_ENV+=("$name=${!name}")
done
VERL_BASE="${VERL_BASE:-}"
# The model and data folders the user left to this script (read before it or its CPU profile sets them): a dry run
# on a machine that has not prepared them warns; an absent folder the user named fails it, as it fails a launch.
ABSENT_OK=()
[ -n "${MODEL_DIR:-}" ] || ABSENT_OK+=(MODEL_DIR)
[ -n "${DATA_DIR:-}" ] || ABSENT_OK+=(DATA_DIR)

VARIANT=real
PROFILE="${PROFILE:-npu}"
DRY_RUN=()
JSON=()
LAUNCH_ENV=()
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) VARIANT="${2:?--variant needs real or random}"; shift 2 ;;
    --variant=*) VARIANT="${1#--variant=}"; shift ;;
    --dry-run) DRY_RUN=(--dry-run); shift ;;
    --json) DRY_RUN=(--dry-run); JSON=(--json); shift ;;
    --cpu) PROFILE=cpu; shift ;;
    --base=*) VERL_BASE="${1#--base=}"; shift ;;
    --base)
      [ $# -gt 1 ] || { echo "$(basename "$0"): --base needs a version (e.g. --base 0.7.1)" >&2; exit 2; }
      VERL_BASE="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    --*=*|--[a-z]*)
      recipes_unknown_option "$(basename "$0")" "$1" --variant --dry-run --json --cpu --base --help; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
case "$PROFILE" in
  npu|cpu) ;;
  *) echo "$(basename "$0"): PROFILE must be npu or cpu, not '$PROFILE'" >&2; exit 2 ;;
esac
# shellcheck source=llm_rl/deepseek_r1/env.sh
source "$RECIPE_DIR/env.sh"
# shellcheck source=../../scripts/find_python.sh
source "$REPO_DIR/scripts/find_python.sh"
recipes_find_python "$(basename "$0")" "$RECIPE_DIR/recipe.toml" || exit 1
# The base (--base / VERL_BASE, else recipe.toml's default_base) and what it needs, resolved once by the manifest
# reader: VERL_BASE, RECIPE_TREE (the default verl tree), BASE_OVERRIDES, BASE_CPU_OVERRIDES, BASE_RANDOM_OVERRIDES,
# BASE_CPU_ENV, RECIPE_DIE, RECIPE_REWARD and RECIPE_REWARD_FN (the reward file and function of recipe.toml's [reward]).
# An unknown base or profile: one line, exit 2 (python3 -m ascend_rl resolve --help).
resolved="$(cd "$REPO_DIR" && "$PYTHON" -m ascend_rl resolve deepseek_r1 --base "$VERL_BASE" --profile "$PROFILE" --shell)" \
  || exit 2
eval "$resolved"
recipes_base_env  # env.sh: VLLM_USE_V1 on the vLLM 0.13 bases only
# its absolute path (without resolving a venv's symlink), for the node-by-node commands: found before any cd
PYTHON_PATH="$(command -v "$PYTHON")"
case "$PYTHON_PATH" in /*) ;; *) PYTHON_PATH="$(cd "$(dirname "$PYTHON_PATH")" && pwd)/$(basename "$PYTHON_PATH")" ;; esac
# as a node line names it: a Python inside this checkout (its .venv) by its path in the checkout, as the lines name
# the scripts (run from the repository root, each node's own checkout), never this machine's folder
NODE_PYTHON="$PYTHON_PATH"
case "$PYTHON_PATH" in "$REPO_DIR"/*) NODE_PYTHON="${PYTHON_PATH#"$REPO_DIR"/}" ;; esac
case "$PROFILE" in
  npu) CPU_OVERRIDES=(); PREFLIGHT_PROFILE=(); RUN_PYTHONPATH="${PYTHONPATH:-}" ;;
  cpu)
    # megatron-core / mbridge at their pins, from the download cache (fetched once); the CPU path only. The base's own
    # Megatron stack where it has one (artifacts.MEGATRON_STACKS: 0.9.1's megatron-core 0.16.1 + Megatron-Bridge 0.3.1)
    MEGATRON_DIR=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'import sys; from pathlib import Path; from ascend_rl import artifacts; base = sys.argv[1] if sys.argv[1] in artifacts.MEGATRON_STACKS else None; print(artifacts.megatron_packages(Path(sys.executable), base))' "$VERL_BASE") \
      || { echo "$(basename "$0"): megatron-core for the CPU profile cannot be installed (see above)" >&2; exit 1; }
    RECIPES_CPU_PYTHONPATH="${VERL_DIR:-$RECIPE_TREE}:$MEGATRON_DIR${PYTHONPATH:+:$PYTHONPATH}"
    # A launch of this launcher's own records its /dev/shm names (below): the Ray workers, whose PYTHONPATH this
    # replaces, carry the record's folder first, as the driver does
    [ -n "${RECIPES_SHM_RECORD:-}" ] || RECIPES_CPU_PYTHONPATH="$REPO_DIR/ascend_rl/shm_record:$RECIPES_CPU_PYTHONPATH"
    # main_ppo starts its own Ray with these (the user's PYTHONPATH last)
    RUN_PYTHONPATH="$RECIPES_CPU_PYTHONPATH"
    # shellcheck source=cpu_profile.sh
    source "$RECIPE_DIR/cpu_profile.sh" ;;
esac

NNODES="${NNODES:-16}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"
MODEL_DIR="${MODEL_DIR:-$RECIPE_DIR/model/DeepSeek-R1-bf16}"
MCORE_DIR="${MCORE_DIR:-$RECIPE_DIR/model/DeepSeek-R1-mcore}"
DATA_DIR="${DATA_DIR:-$RECIPE_DIR/data/deepscaler}"
LOG_DIR="${LOG_DIR:-$RECIPE_DIR/run_log}"
CKPT_DIR="${CKPT_DIR:-$RECIPE_DIR/checkpoints}"
RUN_NAME="${RUN_NAME:-deepseek_r1_a3_${VARIANT}}"
# The checkpoint the actor, the reference and the rollout load. --variant random on a base whose engine always loads
# one (recipe.toml's random_checkpoint: 0.9.1): a random checkpoint of MODEL_DIR's config, written once (a dry run
# names it and writes nothing), which all three load, so the reference starts from the actor's weights.
MODEL_PATH="$MODEL_DIR"
if [ "$VARIANT" = random ] && [ "$BASE_RANDOM_CHECKPOINT" = 1 ]; then
  RANDOM_MODEL_DIR="${RANDOM_MODEL_DIR:-$RECIPE_DIR/model/random}"
  MODEL_PATH="$(cd "$RECIPE_DIR" && PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" \
    -m llm_rl.deepseek_r1.random_checkpoint --config "$MODEL_DIR" --out "$RANDOM_MODEL_DIR" "${DRY_RUN[@]}")" || exit 1
fi
# Metrics backends as in the Qwen launcher: console + TensorBoard unless LOGGER says otherwise.
LOGGER="${LOGGER:-console,tensorboard}"
export TENSORBOARD_DIR="${TENSORBOARD_DIR:-$LOG_DIR/tensorboard/$RUN_NAME}"
# verl's file logger (LOGGER=...,file) writes <project>/<run>.jsonl under this folder, not the working directory.
export VERL_FILE_LOGGER_ROOT="${VERL_FILE_LOGGER_ROOT:-$LOG_DIR}"
# What this launcher exports for the trainer (env.sh and the CPU profile name theirs), for the dry run's plan;
# PYTHONPATH is set just before the trainer starts.
# the last two: a real launch sets RECIPES_SHM_RECORD, a launch on a Ray cluster RAY_AUTH_MODE (below)
LAUNCH_ENV+=(TENSORBOARD_DIR VERL_FILE_LOGGER_ROOT RECIPES_SHM_RECORD RAY_AUTH_MODE)
TRAINER_PYTHONPATH="$VERL_DIR${RUN_PYTHONPATH:+:$RUN_PYTHONPATH}"

# The seed's deployment: 256 dies; actor/ref TP4 EP8 PP8 (DP8); 512 prompts x 16 samples, 1K in, 3K out.
# One mini-batch and one epoch keep the update on-policy, which the old_log_prob skip requires.
OVERRIDES=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=False
  data.train_files="$DATA_DIR/train.parquet"
  data.val_files="$DATA_DIR/test.parquet"
  data.train_batch_size=512
  data.max_prompt_length=1024
  data.max_response_length=3072
  data.filter_overlong_prompts=True
  data.truncation=error
  # the reward file and function recipe.toml's [reward] names (resolved above)
  custom_reward_function.path="$RECIPE_REWARD"
  custom_reward_function.name="$RECIPE_REWARD_FN"
  actor_rollout_ref.model.path="$MODEL_PATH"
  actor_rollout_ref.model.trust_remote_code=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=512
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.recompute_old_log_prob=False
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4
  actor_rollout_ref.actor.megatron.expert_model_parallel_size=8
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8
  # Whole experts on each EP rank (expert TP 1): verl 0.6.0's default, but 0.7.1 and 0.9.1 leave it null, and
  # megatron-core then splits every expert over TP (expert TP = TP, 4 here), where the AlltoAllV reshard
  # (ds-0006 / ds-0106 / ds-0206) falls back to the all-gather (expert_reshard.py: "expert tensor parallel size")
  # and the memory plan's expert layout no longer holds.
  actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1
  actor_rollout_ref.actor.megatron.param_offload=True
  actor_rollout_ref.actor.megatron.optimizer_offload=True
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4
  actor_rollout_ref.ref.megatron.expert_model_parallel_size=8
  actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=8
  actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=1
  actor_rollout_ref.ref.megatron.param_offload=True
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
  # MindSpeed training optimisations (seed: swap optimizer and fused operators).
  +actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn=True
  +actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=alltoall
  +actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=True
  +actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_rotary_pos_emb=True
  +actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_swiglu=True
  +actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer=True
  # Activation recompute as the original recipe sets it (full, block, 8 layers per stage: every layer of a stage of
  # at most 8; megatron_layout.Recompute), planned by plan_memory and accepted by the shape check's build. The
  # pipeline split that goes with PP8 (61 layers do not divide over 8 stages) is each base's (recipe.toml).
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=block
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=8
  # Gradients accumulated and reduced in bf16, as in the original's trainer (its MindSpeed config leaves Megatron's
  # accumulate_allreduce_grads_in_fp32 at False). verl's own DDP config says fp32: at TP4 PP8 EP8 that is a 44 GiB
  # gradient buffer per die and an update over the A3 die's 64 GiB (plan_memory; docs/deepseek_r1-evidence.md, "Memory per die").
  +actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32=False
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=16
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.gpu_memory_utilization=0.8
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
  trainer.device=npu
  trainer.nnodes="$NNODES"
  trainer.n_gpus_per_node="$NPUS_PER_NODE"
  trainer.total_epochs=1
  trainer.save_freq=-1
  trainer.test_freq=-1
  trainer.val_before_train=False
  "trainer.logger=[$LOGGER]"
  +ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR="$TENSORBOARD_DIR"
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_ROOT="$VERL_FILE_LOGGER_ROOT"
  trainer.resume_mode=auto
  trainer.max_actor_ckpt_to_keep=1
  trainer.project_name=verl_grpo_deepseek_r1
  trainer.experiment_name="$RUN_NAME"
  trainer.default_local_dir="$CKPT_DIR/$RUN_NAME"
)
# What the base's rollout takes: its [bases."B"] overrides in recipe.toml (the reasons are there), resolved above;
# among them the weight sync's expert routing (rollout.expert_reshard=alltoallv: each routed expert only to the
# rollout ranks that keep it), on the bases whose series carries the reshard, and the gradients' offload where verl
# has a key for it (megatron.grad_offload; 0.9.1's param_offload frees the gradient buffer with the parameters).
OVERRIDES+=("${BASE_OVERRIDES[@]}")
case "$VARIANT" in
  real) OVERRIDES+=(
    actor_rollout_ref.rollout.data_parallel_size=64
    actor_rollout_ref.rollout.expert_parallel_size=128
    # 8192 -> 1024 against the real-weight OOM (seed); below max_model_len 4096, so it needs chunked prefill
    # and, on 0.6.0, patch ds-0007 (verl 0.6.0 refused the pair; 0.7.1 and vLLM 0.13 accept it)
    actor_rollout_ref.rollout.max_num_batched_tokens=1024
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.actor.megatron.use_dist_checkpointing=True
    actor_rollout_ref.actor.megatron.dist_checkpointing_path="$MCORE_DIR"
    actor_rollout_ref.ref.megatron.use_dist_checkpointing=True
    actor_rollout_ref.ref.megatron.dist_checkpointing_path="$MCORE_DIR"
  ) ;;
  random) OVERRIDES+=(
    actor_rollout_ref.rollout.data_parallel_size=128
    actor_rollout_ref.rollout.expert_parallel_size=256
    # how the base starts from random weights: its random_overrides in recipe.toml (load_weight=False on 0.6.0 and
    # 0.7.1), resolved above
    "${BASE_RANDOM_OVERRIDES[@]}"
  ) ;;
  *) echo "run_deepseek_r1_a3.sh: error: --variant must be real or random, not '$VARIANT'" >&2; exit 2 ;;
esac
OVERRIDES+=("${CPU_OVERRIDES[@]}")

PREFLIGHT_PATHS=()
for name in "${ABSENT_OK[@]}"; do PREFLIGHT_PATHS+=(--may-be-absent "${!name}"); done
# the random checkpoint a launch writes before the trainer starts (a dry run only names it)
[ "$MODEL_PATH" = "$MODEL_DIR" ] || PREFLIGHT_PATHS+=(--may-be-absent "$MODEL_PATH")

cd "$REPO_DIR"
"$PYTHON" -m ascend_rl preflight --recipe deepseek_r1 --base "$VERL_BASE" --config-name ppo_megatron_trainer \
  --verl-dir "$VERL_DIR" --nnodes "$NNODES" "${PREFLIGHT_PROFILE[@]}" "${DRY_RUN[@]}" "${JSON[@]}" "${PREFLIGHT_PATHS[@]}" \
  "${LAUNCH_ENV[@]/#/--env=}" --env="PYTHONPATH=$TRAINER_PYTHONPATH" -- "${OVERRIDES[@]}" "${ARGS[@]}"
if [ "${#DRY_RUN[@]}" -gt 0 ]; then
  NODES_FD=1
  [ "${#JSON[@]}" -eq 0 ] || NODES_FD=2  # stdout holds the JSON plan alone
  PLAN=(--nodes "$NNODES" --head-ip "${HEAD_IP:-<head-ip>}"); JOB=(--variant "$VARIANT" --base "$VERL_BASE")
  if [ "$PROFILE" = cpu ] && [ "$NNODES" = 1 ]; then
    PLAN=(--local); JOB=(--cpu --base "$VERL_BASE")  # one machine: main_ppo starts its own Ray
  elif [ "$PROFILE" = cpu ]; then
    # CPU nodes: ray_start.sh --cpu on each, then this launcher with the node count on the head
    PLAN+=(--ray-start "llm_rl/deepseek_r1/ray_start.sh --cpu"); JOB=(--cpu --base "$VERL_BASE")
  fi
  # Every line carries what decides the run: the base (ray_start.sh puts verl-<base> on its workers' path), the
  # Python this dry run checked with (ray_start.sh starts that Python's Ray), the node count and ranks per node,
  # and what the user set (NODE_ENV: the socket interface, the folders, ...).
  PLAN_ENV=("VERL_BASE=$VERL_BASE" "PYTHON=$NODE_PYTHON")
  [ "$NNODES" = 1 ] || PLAN_ENV+=("NNODES=$NNODES" "NPUS_PER_NODE=$NPUS_PER_NODE")
  PLAN_ENV+=("${NODE_ENV[@]}")
  {
    [ "$PROFILE" = cpu ] || echo "node-by-node:"
    [ "$NNODES" = 1 ] || [ -n "${SOCKET_IFNAME:-}" ] \
      || echo "(SOCKET_IFNAME unset: each node takes its default route's interface; set it to name the cluster's)"
    "$PYTHON" -m ascend_rl ray_cluster plan "${PLAN[@]}" "${PLAN_ENV[@]/#/--env=}" \
      -- bash llm_rl/deepseek_r1/run_deepseek_r1_a3.sh "${JOB[@]}" "${ARGS[@]}"
  } >&"$NODES_FD"
  exit 0
fi
# The NPU cluster, or CPU nodes (NNODES > 1): every node's ray_start.sh has run; wait until all joined and every
# node offers one of the resource verl's placement bundles ask per rank (`NPU` on NPUs, the lowercase `cpu` on CPU
# nodes: ray_start.sh --cpu offers it), else a bundle would wait forever. One CPU machine (NNODES=1): main_ppo
# starts its own Ray.
if [ "$PROFILE" != cpu ] || [ "$NNODES" != 1 ]; then
  # the auth mode ray_start.sh gave the cluster (unset: disabled): main_ppo's driver, which finds the cluster by
  # itself, would otherwise take token mode from a ~/.ray/auth_token on this machine (Ray 2.60) and its TaskRunner
  # never start
  export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
  RANK_RESOURCE=NPU
  [ "$PROFILE" != cpu ] || RANK_RESOURCE=cpu
  # ... and that every node's Ray runs this launcher's Python environment (interpreter, verl, vLLM, torch): a node
  # started with another Python would fail the run in step 1 (a module it lacks), or run another verl. The driver's
  # side is read on the trainer's PYTHONPATH, as main_ppo runs: the CPU tree's vLLM distribution record (cpu-0014)
  # is on it, as on the nodes' (ray_start.sh puts the tree first)
  PYTHONPATH="$TRAINER_PYTHONPATH" "$PYTHON" -m ascend_rl ray_cluster wait --nodes "$NNODES" --timeout "${RAY_WAIT_TIMEOUT:-60}" \
    --resource "$RANK_RESOURCE=$NPUS_PER_NODE" --same-env "$VERL_DIR"
fi
# Across nodes every rank saves its shards into trainer.default_local_dir and a rerun resumes from there: refuse
# now, in one line naming the nodes, unless every node sees the folder the head sees (a node-local disk would leave
# each node's shards where the others cannot read them). The last setting of it wins, as in Hydra.
if [ "$NNODES" != 1 ]; then
  CKPT_PATH=
  for arg in "${OVERRIDES[@]}" "${ARGS[@]}"; do
    case "$arg" in trainer.default_local_dir=*|+trainer.default_local_dir=*|++trainer.default_local_dir=*)
      CKPT_PATH="${arg#*=}" ;; esac
  done
  CKPT_PATH="${CKPT_PATH#[\'\"]}"; CKPT_PATH="${CKPT_PATH%[\'\"]}"
  case "$CKPT_PATH" in /*) ;; *) CKPT_PATH="$RECIPE_DIR/$CKPT_PATH" ;; esac  # main_ppo runs in $RECIPE_DIR
  "$PYTHON" -m ascend_rl ray_cluster shared "$CKPT_PATH" --what trainer.default_local_dir
fi

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
# Across nodes a watch beside main_ppo ends the run in one line when a placement group stays pending
# (RAY_PENDING_TIMEOUT seconds: verl's ray.get(pg.ready()) would wait forever) or a node is lost while it runs (the
# ranks left would wait in a collective); it writes to its own file (tee holds $LOG open), added to $LOG at the end.
# RAY_WATCH=0 leaves it out.
WATCH_PID=
if [ "$NNODES" != 1 ] && [ "${RAY_WATCH:-1}" != 0 ]; then
  WATCH_LOG="$LOG.watch"
  (cd "$REPO_DIR" && exec "$PYTHON" -m ascend_rl ray_cluster watch --pending-timeout "${RAY_PENDING_TIMEOUT:-600}" \
    --lost-node --end-driver --while-pid $$) >"$WATCH_LOG" 2>&1 &
  WATCH_PID=$!
  trap 'kill -TERM "$WATCH_PID" 2>/dev/null || true' EXIT
fi
rc=0  # (set -e would end the script at a failed pipeline; pipefail makes rc main_ppo's status)
"$PYTHON" -m verl.trainer.main_ppo --config-name ppo_megatron_trainer "${OVERRIDES[@]}" "${ARGS[@]}" 2>&1 | tee "$LOG" || rc=$?
if [ -n "$WATCH_PID" ]; then  # SIGTERM: it stops at its next look, after the line of a driver it is ending
  kill -TERM "$WATCH_PID" 2>/dev/null || true
  wait "$WATCH_PID" 2>/dev/null || true
  trap - EXIT
  [ ! -s "$WATCH_LOG" ] || cat "$WATCH_LOG" >>"$LOG"  # its line reaches run_failure's one line below
  rm -f "$WATCH_LOG"
fi
# A failed run ends with one line saying what died (a trainer rank, the vLLM server, ...), in which step and phase
[ "$rc" -eq 0 ] || (cd "$REPO_DIR" && "$PYTHON" -m ascend_rl run_failure "$LOG") || true
exit "$rc"
