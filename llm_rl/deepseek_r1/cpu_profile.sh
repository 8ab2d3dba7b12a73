# The CPU profile of the DeepSeek launcher (sourced by run_deepseek_r1_a3.sh for --cpu or PROFILE=cpu).
#
# The recipe's own launch (preflight, then verl.trainer.main_ppo with ppo_megatron_trainer and the
# launcher's overrides, random variant) on a machine with no accelerator, in two processes: verl's
# Megatron actor and reference (EP=2) on gloo, verl's sync vLLM rollout on the vLLM 0.13.0 CPU build,
# explicit offload, the AlltoAllV expert reshard setting, a tiny DeepSeek-V3 checkpoint. Only what must
# shrink or what CPU needs is set here; the launcher's overrides come first and these win over them, the
# user's arguments win over both. The verl tree is llm_rl/deepseek_r1/verl-<base>-cpu: the recipe's series plus
# patches/cpu/ (cpu-0005 makes megatron-core run on CPU), never the tree an NPU launch uses.
# shellcheck shell=bash disable=SC2034

VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"  # verl-<base>-cpu (the launcher's `ascend_rl resolve --profile cpu`)
# what `python3 -m ascend_rl e2e --runs deepseek` (make e2e) makes: ascend_rl/tiny/deepseek_v3.py, the bundled problems
MODEL_DIR="${MODEL_DIR:-$REPO_DIR/e2e_out/deepseek_inputs/model}"
DATA_DIR="${DATA_DIR:-$REPO_DIR/e2e_out/deepseek_inputs/data}"
PREFLIGHT_PROFILE=(--with cpu --cpu --made-by "make e2e E2E_ARGS='--runs deepseek'")
# random-initialised weights (no Megatron checkpoint of the tiny model to load), as --variant random
VARIANT=random
# where verl 0.9.1's random variant writes its random checkpoint of the tiny model's config (once): beside the inputs
RANDOM_MODEL_DIR="${RANDOM_MODEL_DIR:-$REPO_DIR/e2e_out/deepseek_inputs/random}"
# one machine by default; NNODES=N runs the ranks across N nodes whose Ray ray_start.sh --cpu started
# (the simulated cluster of docs/cluster.md): one rank per node unless NPUS_PER_NODE says otherwise
NNODES="${NNODES:-1}"
if [ "$NNODES" = 1 ]; then NPUS_PER_NODE="${NPUS_PER_NODE:-2}"; else NPUS_PER_NODE="${NPUS_PER_NODE:-1}"; fi

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# vLLM's CPU platform refuses MLA: it runs DeepSeek's attention unabsorbed
export VLLM_MLA_DISABLE=1
# two vLLM engines on two cores: vLLM's CPU worker would bind both to the same cores (rank 1 finds none)
export VLLM_CPU_OMP_THREADS_BIND=nobind
export RAY_USE_UVLOOP=0
export OMP_NUM_THREADS="${CPU_OMP_NUM_THREADS:-1}"
export TOKENIZERS_PARALLELISM=false
LAUNCH_ENV+=(VLLM_CPU_KVCACHE_SPACE VLLM_MLA_DISABLE VLLM_CPU_OMP_THREADS_BIND RAY_USE_UVLOOP OMP_NUM_THREADS TOKENIZERS_PARALLELISM)

ENV_VARS=+ray_kwargs.ray_init.runtime_env.env_vars
CPU_OVERRIDES=(
  trainer.device=cpu
  trainer.nnodes="$NNODES"
  trainer.n_gpus_per_node="$NPUS_PER_NODE"
  # the Ray workers import megatron-core from its cache folder and read the CPU settings above
  "$ENV_VARS.PYTHONPATH=$RECIPES_CPU_PYTHONPATH"
  "$ENV_VARS.VLLM_MLA_DISABLE='1'"
  "$ENV_VARS.VLLM_CPU_KVCACHE_SPACE='$VLLM_CPU_KVCACHE_SPACE'"
  "$ENV_VARS.VLLM_CPU_OMP_THREADS_BIND=nobind"
  "$ENV_VARS.RAY_USE_UVLOOP='0'"
  "$ENV_VARS.OMP_NUM_THREADS='$OMP_NUM_THREADS'"
  # two processes: experts over EP=2, the rest data-parallel; no TP / PP
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1
  actor_rollout_ref.actor.megatron.expert_model_parallel_size=2
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1
  actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1
  actor_rollout_ref.ref.megatron.expert_model_parallel_size=2
  # MindSpeed's options (flash attention, grouped GEMM, fused RoPE / SwiGLU, swap optimizer) are NPU-only: dropped
  '~actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn'
  '~actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_rotary_pos_emb'
  '~actor_rollout_ref.actor.megatron.override_transformer_config.use_fused_swiglu'
  '~actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer'
  # what megatron-core has only with TransformerEngine / apex: local attention, no grouped GEMM, plain norms
  actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=False
  +actor_rollout_ref.actor.megatron.override_transformer_config.persist_layer_norm=False
  actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=local
  # no activation recompute on the tiny model (the launch's full/block/8 is checked by the shape check's build, not
  # run here); the pipeline split goes with PP1 in each base's cpu_overrides (recipe.toml)
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=null
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=null
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=null
  # one vLLM engine per process (vLLM data parallelism > 1 needs the cluster: patches ds-0002 / ds-0005)
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.data_parallel_size=1
  actor_rollout_ref.rollout.expert_parallel_size=1
  # vLLM's CPU custom ops disagree with Hugging Face on this model; fp32 so both sides agree to rounding
  '+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config={custom_ops:[none]}'
  actor_rollout_ref.rollout.dtype=float32
  actor_rollout_ref.rollout.gpu_memory_utilization=0.1
  actor_rollout_ref.rollout.calculate_log_probs=True
  # the sizes that shrink: 2 prompts x 2 samples, 32-token answers, 3 steps
  data.train_batch_size=2
  data.max_prompt_length=192
  data.max_response_length=32
  actor_rollout_ref.rollout.n=2
  actor_rollout_ref.actor.ppo_mini_batch_size=2
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
  data.dataloader_num_workers=0
  data.return_raw_chat=True
  trainer.total_training_steps=3
  'trainer.logger=[console,file]'
  trainer.resume_mode=disable
)
if [ "$NNODES" = 1 ]; then
  # main_ppo starts its own Ray: verl's bundles ask for GPUs and a lowercase "cpu" resource with trainer.device=cpu.
  # On several nodes it attaches to the cluster ray_start.sh --cpu made (each node offers `cpu` per rank), and Ray
  # refuses these there ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
  CPU_OVERRIDES+=(
    +ray_kwargs.ray_init.num_cpus=8
    +ray_kwargs.ray_init.num_gpus="$NPUS_PER_NODE"
    "+ray_kwargs.ray_init.resources={cpu:$NPUS_PER_NODE}"
    +ray_kwargs.ray_init.include_dashboard=False
  )
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
