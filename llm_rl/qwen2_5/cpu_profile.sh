# The CPU profile of the Qwen2.5 launchers (sourced by run_qwen2_5_1_5b.sh for --cpu or PROFILE=cpu).
#
# It runs the recipe's own launch path (preflight, then verl.trainer.main_ppo with the recipe's
# overrides) on a machine with no accelerator: verl's vLLM rollout on the vLLM 0.13.0 CPU build,
# FSDP2 on gloo, a tiny Qwen2 checkpoint. Only what must shrink or what CPU needs is set here; the
# recipe's overrides come first and these win over them, the user's arguments win over both.
# The verl tree is llm_rl/qwen2_5/verl-<base>-cpu: the base's series plus patches/cpu/'s for that base (--with cpu),
# never the tree an NPU launch uses. `make e2e` drives this profile; see the recipe README.
# shellcheck shell=bash disable=SC2034

VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"  # verl-<base>-cpu (the launcher's `ascend_rl resolve --profile cpu`)
MODEL_DIR="${MODEL_DIR:-$REPO_DIR/e2e_out/model}"
DATA_DIR="${DATA_DIR:-$REPO_DIR/e2e_out/data}"
PREFLIGHT_PROFILE=(--with cpu --cpu --made-by 'make e2e')
# Ranks: NPUS trainer processes (the launcher checked it: npus_count), one FSDP2 shard each on gloo, each feeding a
# vLLM engine of its own (rollout TP 1: verl starts world / TP server replicas). 1 on run_qwen2_5_1_5b_single.sh,
# NPUS (default 4) on run_qwen2_5_1_5b.sh; every size below that depends on it is the one-rank value at NPUS=1.
# shellcheck disable=SC2154  # npus_count: the launcher's, set before it sources this file
RANKS=$npus_count

# vLLM's CPU build reserves ~12 GiB of KV cache by default; the tiny model needs far less.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# Ray installs uvloop (a vLLM dependency) as the workers' event loop, and verl's
# asyncio.get_event_loop() calls then fail in the worker: keep asyncio's own loop.
export RAY_USE_UVLOOP=0
# Two cores: one thread per process keeps Ray's workers and vLLM's engine from oversubscribing.
export OMP_NUM_THREADS="${CPU_OMP_NUM_THREADS:-1}"
export TOKENIZERS_PARALLELISM=false
LAUNCH_ENV+=(VLLM_CPU_KVCACHE_SPACE RAY_USE_UVLOOP TOKENIZERS_PARALLELISM)

CPU_OVERRIDES=(
  trainer.device=cpu
  # Ray: verl's placement bundles ask for a GPU count and a lowercase "cpu" resource when
  # trainer.device=cpu, one of each per rank; the vLLM server actors (async mode, one per rank) need a CPU slot
  # of their own. Each rank's bundle holds 3 CPUs (verl colocates up to 3 worker groups): 8 for one rank (its
  # bundle, the driver, its server and the loop workers, with room), 4 more for each further rank (its bundle
  # and its server). Over-reported on purpose: Ray only counts them.
  "+ray_kwargs.ray_init.num_cpus=$((4 * RANKS + 4))"
  "+ray_kwargs.ray_init.num_gpus=$RANKS"
  "+ray_kwargs.ray_init.resources={cpu:$RANKS}"
  +ray_kwargs.ray_init.include_dashboard=False
  "trainer.n_gpus_per_node=$RANKS"
  # FSDP1 refuses CPU parameters with sync_module_states; FSDP2 runs on gloo.
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.ref.strategy=fsdp2
  # flash-attn's varlen path (remove padding) does not exist on CPU.
  actor_rollout_ref.model.use_remove_padding=False
  # The sizes that shrink: batch 2 prompts x 4 samples per rank (one mini-batch: each rank's share, 8 samples,
  # is one micro-batch), 64-token answers.
  "data.train_batch_size=$((2 * RANKS))"
  data.max_prompt_length=192
  data.max_response_length=64
  actor_rollout_ref.rollout.n=4
  "actor_rollout_ref.actor.ppo_mini_batch_size=$((2 * RANKS))"
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.gpu_memory_utilization=0.1
  # One agent-loop worker (async mode) and no data-loader processes: each costs ~1 GiB here.
  actor_rollout_ref.rollout.agent.num_workers=1
  data.dataloader_num_workers=0
  # vLLM's CPU platform has no sleep mode: keep the engine's memory, sync weights without it.
  actor_rollout_ref.rollout.free_cache_engine=False
  # vLLM's own log-probs of its samples: verl logs training/rollout_probs_diff_* (the sync proof).
  actor_rollout_ref.rollout.calculate_log_probs=True
  # The agent-loop (async) rollout reads the raw chat; harmless in sync mode.
  data.return_raw_chat=True
  trainer.val_before_train=False
  trainer.test_freq=-1
  trainer.total_epochs=1
  trainer.save_freq=-1
  'trainer.logger=[console,file]'
)

# More than one rank: one vLLM engine per rank (TP 1, as the recipe has it), each in its own process. vLLM's CPU
# worker would bind every engine's threads to the cores of the first NUMA node (each engine's worker is rank 0 of
# its own), one thread per core: unbound, they take OMP_NUM_THREADS (1) each.
if [ "$RANKS" -gt 1 ]; then
  export VLLM_CPU_OMP_THREADS_BIND=nobind
  LAUNCH_ENV+=(VLLM_CPU_OMP_THREADS_BIND)
  CPU_OVERRIDES+=(actor_rollout_ref.rollout.tensor_model_parallel_size=1)
fi

# What the base needs on top on CPU: its [bases."B"] cpu_overrides and cpu_env in recipe.toml (say why there),
# resolved by the launcher; an environment variable the user set wins over cpu_env.
# shellcheck disable=SC2154  # BASE_CPU_OVERRIDES, BASE_CPU_ENV: the launcher's, from `ascend_rl resolve`
CPU_OVERRIDES+=("${BASE_CPU_OVERRIDES[@]}")
for pair in "${BASE_CPU_ENV[@]}"; do
  name="${pair%%=*}"
  export "$name=${!name:-${pair#*=}}"
  LAUNCH_ENV+=("$name")
done
