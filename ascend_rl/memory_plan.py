"""Per-die memory plan of one GRPO step: what each phase holds on one NPU die, from the launch settings.

Nothing here can be measured without the cluster, so the plan is arithmetic over the launch's own settings
(the dry run's JSON plan, or the composed config the preflight holds) and the model's config.json: the bytes
per die of the weights of each role (actor, reference, rollout) by their shard (TP / PP / EP / DP, dtype), the
actor's gradients and optimizer states (with the distributed optimizer's sharding), the KV cache vLLM would
allocate from gpu_memory_utilization, the reshard buffers of the weight sync (from the AlltoAllV plan of
ascend_rl/moe_reshard.py, not re-derived here) and the activations (an estimate, and labelled so).
The phases follow verl's colocated hybrid engine in the order one step runs them, offload / onload
transitions included, so the peak names the phase it falls in and its largest term.

What is exact and what is not (docs/memory_plan.md says more): weights, gradients, optimizer states and the
reshard buffers are counts of tensor bytes; the KV cache is the rule of the vLLM-Ascend the launch's verl base pins
(0.13.0 on verl 0.6.0 / 0.7.1: the die's memory times gpu_memory_utilization, less everything allocated on the die
when the engine starts; 0.23.0.post1 on verl 0.9.1: that share less the engine's own weights and profile peak only);
verl 0.9.1's engine workers hold the reference on the host and stream offloaded actor weights to the sync; activations are
an upper-bound estimate; the caching allocator's rounding, the CANN runtime and HCCL's buffers are left to the
headroom (`headroom_bytes`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ascend_rl import manifest, megatron_layout
from ascend_rl import moe_reshard as mr

GIB = 2**30
MIB = 2**20


# ----------------------------------------------------------------------------- the dies


@dataclass(frozen=True)
class Die:
    """One NPU device as verl sees it (a card on A2, half a card on A3)."""

    name: str
    memory: int
    source: str


DIES = {
    "A2": Die(
        "Atlas A2 (Ascend 910B, e.g. the guide's 910B2C)",
        64 * GIB,
        "64 GB HBM per NPU: vLLM-Ascend's tutorials size an Atlas 800 A2 server as 64GB x 8 NPU; npu-smi shows "
        "65536 MB per 910B",
    ),
    "A3": Die(
        "Atlas A3 die (Ascend 910C: two dies per card)",
        64 * GIB,
        "an Atlas 800 A3 server is 128GB x 8 NPU shown as 16 devices (vLLM-Ascend's tutorials: davinci0-15), "
        "so 64 GB per die",
    ),
}

# The headroom under the die's memory that a launch's planned peak must leave. The plan counts tensor bytes;
# what it does not count is (1) the CANN runtime context and operator workspace and the caching allocator's
# block rounding and split fragmentation (the launchers cap splits at 512 MB: PYTORCH_NPU_ALLOC_CONF
# max_split_size_mb:512), taken as 1 GiB, and (2) HCCL's communication buffers: HCCL_BUFFSIZE (200 MB by
# default, CANN's environment-variable reference) for the input and for the output of every communicator a
# rank joins (Megatron's TP, PP, EP, DP groups and vLLM's TP / DP / EP groups; none on one die).
RUNTIME_RESERVE = 1 * GIB
HCCL_BUFFSIZE_MB = 200


def headroom_bytes(communicators: int, hccl_buffsize_mb: int = HCCL_BUFFSIZE_MB) -> int:
    """Bytes a launch must leave free on the die: the runtime reserve plus two HCCL buffers per communicator."""
    return RUNTIME_RESERVE + 2 * hccl_buffsize_mb * 10**6 * communicators


# ----------------------------------------------------------------------------- the models

# The config.json numbers the plan reads, for the recipes' models when their checkpoint is not on this machine.
KNOWN_MODELS: dict[str, tuple[dict[str, Any], str]] = {
    "qwen2.5-1.5b": (
        {
            "model_type": "qwen2",
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
        "Qwen/Qwen2.5-1.5B-Instruct config.json (Hugging Face): 1.54B parameters",
    ),
    "deepseek-r1": (
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "first_k_dense_replace": 3,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "num_attention_heads": 128,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "vocab_size": 129280,
            "tie_word_embeddings": False,
            # what a model build reads besides the shapes (the shape check's: Megatron-Bridge's provider refuses
            # the expert bias of noaux_tc routing without the sigmoid score)
            "num_key_value_heads": 128,
            "max_position_embeddings": 163840,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000,
            "rope_scaling": {
                "type": "yarn",
                "factor": 40,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
            },
            "n_group": 8,
            "topk_group": 4,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "num_nextn_predict_layers": 0,
            "hidden_act": "silu",
        },
        "deepseek-ai/DeepSeek-R1 config.json (Hugging Face; DeepSeek-V3's shapes), MTP layer off as "
        "derive_config writes it: 671B parameters",
    ),
}


def known_model(path: str) -> str | None:
    """The shipped table's name for a model folder, guessed from its name (Qwen2_5_1_5B_Instruct, DeepSeek-R1-bf16)."""
    name = Path(path).name.lower().replace("_", ".").replace("-", ".")
    if "qwen2.5" in name and "1.5b" in name:
        return "qwen2.5-1.5b"
    if "deepseek" in name and ("r1" in name or "v3" in name):
        return "deepseek-r1"
    return None


def model_config(path: str | None, name: str | None = None) -> tuple[dict[str, Any], str]:
    """(config, where it came from): the model folder's config.json, else the shipped table's entry."""
    if name:
        if name not in KNOWN_MODELS:
            raise ValueError(f"no shipped config for model {name!r}; known: {', '.join(KNOWN_MODELS)}")
        return KNOWN_MODELS[name]
    if not path:
        raise ValueError(
            "the launch names no model: add actor_rollout_ref.model.path=DIR (a folder with config.json) to the "
            f"overrides, or name a shipped model with --model ({', '.join(KNOWN_MODELS)})"
        )
    if (Path(path) / "config.json").is_file():
        cfg = json.loads((Path(path) / "config.json").read_text())
        return cfg.get("text_config", cfg), str(Path(path) / "config.json")
    guess = known_model(path or "")
    if guess is None:
        raise ValueError(
            f"{path} has no config.json and is none of the shipped models ({', '.join(KNOWN_MODELS)}); "
            "download its config.json there, or name one with --model"
        )
    cfg, source = KNOWN_MODELS[guess]
    # a folder inside the repository by its path there: the line reads the same on every machine (and in the README)
    from ascend_rl.paths import REPO

    shown = Path(path).absolute()
    shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
    return cfg, f"{source} (shipped table: {shown} has no config.json)"


@dataclass(frozen=True)
class Shapes:
    """The model as the plan needs it: every weight with its TP split (moe_reshard's types) and the KV layout."""

    spec: mr.ModelSpec
    hidden: int
    ffn: int  # MLP width per token: the dense FFN, or top-k routed experts plus shared ones
    vocab: int
    kv_bytes_per_token_layer: int  # bf16 K and V (or MLA's latent) of one token in one layer, whole model
    kv_split_by_tp: bool  # GQA heads split over TP; MLA's latent is replicated
    # MLA run unabsorbed (vLLM with VLLM_MLA_DISABLE=1, its CPU platform's only way): K and V of every head at the
    # q/k head size (vLLM's DeepseekV2Attention pads V to it), split over TP; 0 for a model without MLA
    kv_unabsorbed_bytes_per_token_layer: int = 0


def shapes(cfg: Mapping[str, Any]) -> Shapes:
    """The weights of a qwen2 / llama-like or deepseek_v3 config, in moe_reshard's ModelSpec."""
    kind = cfg.get("model_type", "")
    h, n, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    heads = int(cfg["num_attention_heads"])
    D = mr.DenseParam
    if kind == "deepseek_v3":
        ffn, moe_ffn = int(cfg["intermediate_size"]), int(cfg["moe_intermediate_size"])
        experts, first_moe = int(cfg["n_routed_experts"]), int(cfg.get("first_k_dense_replace", 0))
        shared = int(cfg.get("n_shared_experts", 0) or 0)
        q_lora, kv_lora = cfg.get("q_lora_rank"), int(cfg["kv_lora_rank"])
        nope, rope, v_dim = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
        dense: list[mr.DenseParam] = [D("embed_tokens", (vocab, h), 0, layer=-1)]
        for i in range(n):
            p = f"layers.{i}."
            dense += [D(p + "input_layernorm", (h,), layer=i)]
            if q_lora:
                dense += [
                    D(p + "self_attn.q_a_proj", (int(q_lora), h), layer=i),
                    D(p + "self_attn.q_a_layernorm", (int(q_lora),), layer=i),
                    D(p + "self_attn.q_b_proj", (heads * (nope + rope), int(q_lora)), 0, layer=i),
                ]
            else:
                dense += [D(p + "self_attn.q_proj", (heads * (nope + rope), h), 0, layer=i)]
            dense += [
                D(p + "self_attn.kv_a_proj_with_mqa", (kv_lora + rope, h), layer=i),
                D(p + "self_attn.kv_a_layernorm", (kv_lora,), layer=i),
                D(p + "self_attn.kv_b_proj", (heads * (nope + v_dim), kv_lora), 0, layer=i),
                D(p + "self_attn.o_proj", (h, heads * v_dim), 1, layer=i),
                D(p + "post_attention_layernorm", (h,), layer=i),
            ]
            if i < first_moe:
                dense += [
                    D(p + "mlp.gate_up_proj", (2 * ffn, h), 0, layer=i),
                    D(p + "mlp.down_proj", (h, ffn), 1, layer=i),
                ]
            else:
                dense += [
                    D(p + "mlp.gate", (experts, h), layer=i),
                    D(p + "mlp.gate.e_score_correction_bias", (experts,), dtype="float32", layer=i),
                ]
                if shared:
                    dense += [
                        D(p + "mlp.shared_experts.gate_up_proj", (2 * shared * moe_ffn, h), 0, layer=i),
                        D(p + "mlp.shared_experts.down_proj", (h, shared * moe_ffn), 1, layer=i),
                    ]
        dense.append(D("norm", (h,), layer=n))
        if not cfg.get("tie_word_embeddings", False):
            dense.append(D("lm_head", (vocab, h), 0, layer=n))
        expert_params = (
            mr.ExpertParam("mlp.experts.w1", (2 * moe_ffn, h)),  # fused gate/up
            mr.ExpertParam("mlp.experts.w2", (h, moe_ffn)),
        )
        spec = mr.ModelSpec(n, tuple(range(first_moe, n)), experts, expert_params, tuple(dense))
        topk = int(cfg.get("num_experts_per_tok", 1))
        unabsorbed = 2 * heads * (nope + rope) * 2
        return Shapes(spec, h, (topk + shared) * moe_ffn, vocab, (kv_lora + rope) * 2, False, unabsorbed)
    if "num_key_value_heads" not in cfg and kind not in ("qwen2", "llama", "mistral", "qwen3"):
        raise ValueError(f"model_type {kind!r} is not one the plan knows (qwen2, llama, deepseek_v3)")
    ffn = int(cfg["intermediate_size"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or h // heads)
    bias = kind == "qwen2"  # Qwen2 has q/k/v biases
    dense = [D("embed_tokens", (vocab, h), 0, layer=-1)]
    for i in range(n):
        p = f"layers.{i}."
        dense += [
            D(p + "input_layernorm", (h,), layer=i),
            D(p + "self_attn.q_proj", (heads * hd, h), 0, layer=i),
            D(p + "self_attn.k_proj", (kv_heads * hd, h), 0, layer=i),
            D(p + "self_attn.v_proj", (kv_heads * hd, h), 0, layer=i),
        ]
        if bias:
            dense += [
                D(p + "self_attn.q_proj.bias", (heads * hd,), 0, layer=i),
                D(p + "self_attn.k_proj.bias", (kv_heads * hd,), 0, layer=i),
                D(p + "self_attn.v_proj.bias", (kv_heads * hd,), 0, layer=i),
            ]
        dense += [
            D(p + "self_attn.o_proj", (h, heads * hd), 1, layer=i),
            D(p + "post_attention_layernorm", (h,), layer=i),
            D(p + "mlp.gate_up_proj", (2 * ffn, h), 0, layer=i),
            D(p + "mlp.down_proj", (h, ffn), 1, layer=i),
        ]
    dense.append(D("norm", (h,), layer=n))
    if not cfg.get("tie_word_embeddings", False):
        dense.append(D("lm_head", (vocab, h), 0, layer=n))
    spec = mr.ModelSpec(n, (), 0, (), tuple(dense))
    return Shapes(spec, h, ffn, vocab, 2 * kv_heads * hd * 2, True)


def numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def total_params(s: Shapes) -> int:
    """Parameter count of the whole model (routed experts included)."""
    dense = sum(numel(p.shape) for p in s.spec.dense_params)
    experts = len(s.spec.moe_layers) * s.spec.num_experts * sum(numel(e.shape) for e in s.spec.expert_params)
    return dense + experts


# ----------------------------------------------------------------------------- the launch settings

# verl's defaults for the keys the plan reads when a launch does not set them (verl 0.6.0 / 0.7.1 config
# yaml: rollout/rollout.yaml, engine/fsdp.yaml, engine/megatron.yaml; vLLM-Ascend 0.13.0 refresh_block_size, and
# 0.23.0.post1's, utils.py:1380-1381 and :1402-1406, still 128); a base's own differences in BASE_DEFAULTS.
DEFAULTS: dict[str, Any] = {
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.device": "cuda",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.actor.recompute_old_log_prob": True,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
    "actor_rollout_ref.ref.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.param_offload": False,
    "actor_rollout_ref.actor.megatron.grad_offload": False,
    "actor_rollout_ref.actor.megatron.optimizer_offload": False,
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer": True,
    "actor_rollout_ref.actor.megatron.dtype": "bfloat16",  # verl 0.9.1's engine only (memory_plan._megatron_state)
    # the reference's own (0.9.1's yaml: ref.megatron.dtype bfloat16, not the actor's; the CPU profile sets float32)
    "actor_rollout_ref.ref.megatron.dtype": "bfloat16",
    "actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer": False,
    # verl's DDP config (megatron_utils.get_model) sets it True; override_ddp_config can turn it off
    "actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32": True,
    # unset: False on 0.6.0 / 0.7.1; verl 0.9.1's yaml follows the actor's (_generated_ppo_megatron_trainer.yaml:256
    # param_offload: ${oc.select:actor_rollout_ref.actor.megatron.param_offload,False})
    "actor_rollout_ref.ref.megatron.param_offload": None,
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    # Megatron's activation recompute (verl 0.9.1's engine reads no enable_gradient_checkpointing: the key its yaml
    # sets True, _generated_ppo_megatron_trainer.yaml:459, is the HF model's; the engine recomputes only what
    # override_transformer_config asks, recompute_granularity null by default, :69)
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": None,
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method": None,
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers": None,
    # the pipeline split megatron-core builds (ascend_rl/megatron_layout.py: the layout string, or the end stages'
    # counts; neither: an even split, or the build is refused)
    "actor_rollout_ref.actor.megatron.override_transformer_config.pipeline_model_parallel_layout": None,
    "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage": None,
    "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage": None,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.data_parallel_size": 1,
    "actor_rollout_ref.rollout.expert_parallel_size": 1,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.max_num_seqs": 1024,
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.explicit_offload": False,
    "actor_rollout_ref.rollout.expert_reshard": "allgather",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": 0,
    "actor_rollout_ref.rollout.block_size": 128,
    "actor_rollout_ref.rollout.dtype": "bfloat16",
}
VOCAB_PADDING = 64
ROLLOUT_DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}
STRATEGY_OF_CONFIG = {"ppo_trainer": "fsdp", "ppo_megatron_trainer": "megatron"}
# Where a base's config differs from DEFAULTS (verl 0.6.0's) for the keys the plan reads, by (major, minor): 0.7.1's
# rollout.yaml and 0.9.1's _generated_ppo_trainer.yaml set the server-mode sync's bucket to 2048 MB (0.9.1: :372,
# under rollout.checkpoint_engine, read into the plan's key below); 0.9.1 also runs the rollout in server mode by
# default (:294 mode: async) and caps vLLM's batch at 256 sequences (:317 max_num_seqs).
BASE_DEFAULTS: dict[tuple[int, int], dict[str, Any]] = {
    (0, 7): {"actor_rollout_ref.rollout.update_weights_bucket_megabytes": 2048},
    (0, 9): {
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes": 2048,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.max_num_seqs": 256,
        # the megatron-core its constraints file pins (constraints-0.9.1.txt; megatron_layout reads it)
        "_megatron_core": "0.16.1",
    },
}
# the megatron-core of the other bases (constraints.txt: 0.12.1, no pipeline layout string)
DEFAULTS["_megatron_core"] = "0.12.1"
# The vLLM-Ascend whose KV-cache rule the plan applies, by the verl base's (major, minor): each base's constraints
# file pins it (constraints.txt: vllm-ascend 0.13.0; constraints-0.9.1.txt: vllm-ascend 0.23.0.post1).
VLLM_ASCEND_OF_BASE = {(0, 9): "0.23.0.post1"}
VLLM_ASCEND_DEFAULT = "0.13.0"


def base_of(s: Mapping[str, Any]) -> tuple[int, int]:
    """The launch's verl base as (major, minor) (settings' `_verl`, e.g. "0.9.1"); (0, 6) when it is not known."""
    parts = str(s.get("_verl") or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 6


def engine_workers(s: Mapping[str, Any]) -> bool:
    """Whether the launch's FSDP actor runs in verl's engine workers (verl 0.9.1: main_ppo_v0.py:35-41 adds only
    engine_workers.ActorRolloutRefWorker; 0.6.0 / 0.7.1's fsdp_workers with dp_actor are gone)."""
    return base_of(s) >= (0, 9) and str(s["actor_rollout_ref.actor.strategy"]) in ("fsdp", "fsdp2")


def megatron_engine(s: Mapping[str, Any]) -> bool:
    """Whether the launch's Megatron actor runs in verl's engine workers: on verl 0.9.1 main_ppo_v0.py:35-41 adds
    only engine_workers.ActorRolloutRefWorker, whose actor, reference and their offloads are the MegatronEngine's
    (workers/engine/megatron/transformer_impl.py; on an NPU its subclass MindspeedEngineWithLMHead,
    workers/engine/mindspeed/transformer_impl.py:56-57, which adds MindSpeed's repatch from
    override_transformer_config, :40-53, and keeps every buffer and offload of its parent), not
    megatron_workers.py's MegatronPPOActor of 0.6.0 / 0.7.1."""
    return base_of(s) >= (0, 9) and str(s["actor_rollout_ref.actor.strategy"]) == "megatron"


def vllm_ascend(s: Mapping[str, Any]) -> str:
    """The vLLM-Ascend release the launch's base pins (its KV-cache rule is the plan's)."""
    return VLLM_ASCEND_OF_BASE.get(base_of(s), VLLM_ASCEND_DEFAULT)


def _with_base(out: dict[str, Any], version: str | None) -> dict[str, Any]:
    """DEFAULTS with the base's own defaults over them (BASE_DEFAULTS), and the base named (`_verl`)."""
    out["_verl"] = str(version or "")
    out.update(BASE_DEFAULTS.get(base_of(out), {}))
    return out


def _value(raw: Any) -> Any:
    """A Hydra override's text as the value it means (True, 4, 0.8, a string)."""
    if not isinstance(raw, str):
        return raw
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":  # Hydra's quoted string
        return raw[1:-1]
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def settings_from_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a dry run's JSON plan (its final overrides), its verl base's defaults for the rest."""
    out = _with_base(dict(DEFAULTS), (plan.get("verl") or {}).get("version"))
    out["actor_rollout_ref.actor.strategy"] = STRATEGY_OF_CONFIG.get(plan.get("config_name", ""), "fsdp")
    for key, raw in (plan.get("overrides") or {}).items():
        if raw is not None:
            out[key.lstrip("+")] = _value(raw)
    bucket_key = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
    if bucket_key in out:  # verl 0.7.1's and 0.9.1's name of it
        out["actor_rollout_ref.rollout.update_weights_bucket_megabytes"] = out.pop(bucket_key)
    out["_recipe"] = plan.get("recipe")
    # vLLM's own switch (envs.VLLM_MLA_DISABLE: an integer), when the launch sets it (the DeepSeek CPU profile)
    mla_off = str((plan.get("env") or {}).get("VLLM_MLA_DISABLE") or "0").strip()
    out["_vllm_mla_disable"] = mla_off.isdigit() and int(mla_off) != 0
    return out


def settings_from_overrides(overrides: list[str], config_name: str = "ppo_trainer") -> dict[str, Any]:
    """The settings of a launcher's override list (each key's last), verl's defaults for the rest."""
    final = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            final[key.lstrip("+~")] = value
    return settings_from_plan({"config_name": config_name, "overrides": final})


def settings_from_config(cfg, recipe: str | None = None, verl: str | None = None) -> dict[str, Any]:
    """The settings of a composed verl config (OmegaConf), as the preflight holds it; `verl`: the base's version."""
    from omegaconf import OmegaConf

    out = _with_base(dict(DEFAULTS), verl)
    for key in [*DEFAULTS, "actor_rollout_ref.model.path"]:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not OmegaConf.is_config(value):
            out[key] = value
    # rollout.prompt_length / response_length follow data's in verl's config
    bucket = OmegaConf.select(cfg, "actor_rollout_ref.rollout.update_weights_bucket_megabytes", default=None)
    if bucket is None:
        bucket = OmegaConf.select(
            cfg, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", default=None
        )
    out["actor_rollout_ref.rollout.update_weights_bucket_megabytes"] = int(bucket or 0)
    out["_recipe"] = recipe
    return out


# ----------------------------------------------------------------------------- the plan


@dataclass
class Term:
    """One line of a phase: bytes per die, what they are, how they were obtained."""

    name: str
    nbytes: int
    how: str = ""
    estimate: bool = False


@dataclass
class Phase:
    """A phase of the step, or the transition into one (kind 'transition': what moves, what is held after)."""

    name: str
    terms: list[Term]
    kind: str = "phase"
    moved: int = 0  # bytes copied between host and die in a transition
    note: str = ""

    @property
    def total(self) -> int:
        return sum(t.nbytes for t in self.terms)

    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.nbytes) if self.terms else Term("nothing", 0)


@dataclass
class Plan:
    """Every phase of one step on the die that peaks, and what the plan was made from."""

    die: Die
    headroom: int
    phases: list[Phase]
    facts: list[tuple[str, str]] = field(default_factory=list)
    stage: int = 0
    hint: str = ""
    stage_plans: list[Plan] = field(default_factory=list)  # every PP stage's plan, when the stages differ
    kv_bytes_per_token: int = 0  # one token's K and V over all layers, on one rollout rank
    # per training rank of the planned stage: its actor weights, gradients and optimizer states (bytes), where
    # they differ between ranks (the distributed optimizer's and FSDP2's shards)
    rank_terms: dict[int, dict[str, int]] = field(default_factory=dict)

    def phase_max(self, name: str) -> int | None:
        """A phase's bytes on the die where it is largest (over the PP stages)."""
        found = [ph.total for p in (self.stage_plans or [self]) for ph in p.phases if ph.name == name]
        return max(found) if found else None

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def limit(self) -> int:
        return self.die.memory - self.headroom

    def refusal(self) -> str | None:
        """One line when the peak does not fit the die less the headroom, else None."""
        peak = self.peak
        if peak.total <= self.limit:
            return None
        big = peak.largest()
        return (
            f"the planned peak per die, {peak.total / GIB:.1f} GiB in phase '{peak.name}', exceeds the "
            f"{self.die.name}'s {self.die.memory / GIB:.0f} GiB less {self.headroom / GIB:.1f} GiB headroom; "
            f"its largest term is {big.name} ({big.nbytes / GIB:.1f} GiB): {self._advice(big, peak)} "
            "(python3 -m ascend_rl plan_memory shows every term)"
        )

    def _advice(self, big: Term, peak: Phase | None = None) -> str:
        """What to change for the largest term, in one clause."""
        if big.name in ("KV cache", "rollout weights") and peak is not None and peak.name != "generation":
            # the rollout held through a training phase: the plan's sleep mode that does not free the die
            return (
                "the rollout's weights and KV cache stay on the die through training (sleep mode on several NPU "
                "nodes, as the original found): set actor_rollout_ref.rollout.explicit_offload=True"
            )
        if big.name in ("KV cache", "rollout weights", "rollout activations"):
            return (
                "lower actor_rollout_ref.rollout.gpu_memory_utilization, or offload what the die holds beside "
                "vLLM's share (the actor's optimizer_offload / param_offload)"
            )
        if big.estimate:
            return (
                "lower the micro-batch (ppo_micro_batch_size_per_gpu, log_prob_micro_batch_size_per_gpu) or turn on "
                "gradient checkpointing"
            )
        return self.hint or "offload it or shard it wider"


def _b(x: float) -> int:
    return int(round(x))


@dataclass(frozen=True)
class Layout:
    world: int
    strategy: str
    tp: int
    pp: int
    ep: int
    rollout_tp: int
    rollout_ep: int

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def expert_dp(self) -> int:
        return self.world // (self.ep * self.pp)


def _layout(s: Mapping[str, Any]) -> Layout:
    world = int(s["trainer.nnodes"]) * int(s["trainer.n_gpus_per_node"])
    strategy = str(s["actor_rollout_ref.actor.strategy"])
    if strategy == "megatron":
        m = "actor_rollout_ref.actor.megatron."
        tp, pp, ep = (
            int(s[m + k])
            for k in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "expert_model_parallel_size",
            )
        )
    else:
        tp, pp, ep = 1, 1, 1
    r = "actor_rollout_ref.rollout."
    rtp = int(s[r + "tensor_model_parallel_size"])
    rep = int(s[r + "expert_parallel_size"]) or 1
    return Layout(world, strategy, tp, pp, ep, rtp, rep)


# Megatron-core's module order inside a decoder layer (the order named_parameters() yields, megatron-core 0.12.1:
# TransformerLayer builds input_layernorm, self_attention, pre_mlp_layernorm, mlp; Attention builds linear_proj
# before its projections; MLASelfAttention the q projection(s), linear_kv_down_proj, linear_kv_up_proj, then
# q_layernorm and kv_layernorm; SelfAttention linear_qkv (weight, then bias); MoELayer the router, the experts, the
# shared experts), under the checkpoint's names. The router's e_score_correction_bias is no parameter there
# (TopKRouter keeps expert_bias as an fp32 buffer).
MCORE_LAYER_ORDER = (
    "input_layernorm",
    "self_attn.o_proj",
    "self_attn.q_proj",
    "self_attn.q_a_proj",
    "self_attn.q_b_proj",
    "self_attn.qkv",
    "self_attn.qkv.bias",
    "self_attn.kv_a_proj_with_mqa",
    "self_attn.kv_b_proj",
    "self_attn.q_a_layernorm",
    "self_attn.kv_a_layernorm",
    "post_attention_layernorm",
    "mlp.gate",
    "mlp.gate_up_proj",
    "mlp.down_proj",
    "mlp.shared_experts.gate_up_proj",
    "mlp.shared_experts.down_proj",
)
MCORE_BUFFERS_ONLY = ("mlp.gate.e_score_correction_bias",)
# Megatron's attention fuses GQA's q, k and v (and their biases) into linear_qkv
_QKV = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "q_proj.bias": "qkv.bias"}
_QKV.update({"k_proj.bias": "qkv.bias", "v_proj.bias": "qkv.bias"})


# MLA's down-projections, which TransformerEngine's layer spec keeps whole on every TP rank (TELinear,
# parallel_mode="duplicated") and megatron-core's local spec splits over TP (a column-parallel linear); the plan
# plans the TE spec (the NPU's); `_mcore_spec: local` plans the local one, which the shape check builds on a CPU
MLA_DOWN_PROJ = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")


def mcore_params(
    sh: Shapes, tp: int, stage: int, train: mr.TrainLayout, local_spec: bool = False
) -> tuple[list[int], list[int]]:
    """(dense, routed-expert) parameters one Megatron rank of `stage` holds, as element counts in megatron-core's
    named_parameters() order (embedding, layers, final norm, output layer); experts by EP: train.ep's share.
    `local_spec`: megatron-core's local layer spec (MLA_DOWN_PROJ split over TP), not TransformerEngine's."""
    spec = sh.spec
    gqa = any(p.name.endswith("self_attn.k_proj") for p in spec.dense_params)
    here = [p for p in spec.dense_params if train.stage_of_layer(p.layer, spec.num_layers) == stage]
    layers: dict[int, dict[str, int]] = {}
    outer: dict[int, list[int]] = {}
    for p in here:
        n = numel(p.shard_shape(tp))
        if local_spec and tp > 1 and p.name.endswith(MLA_DOWN_PROJ):
            n = numel(p.shape) // tp
        if p.layer < 0 or p.layer >= spec.num_layers:
            outer.setdefault(p.layer, []).append(n)
            continue
        key = p.name.split(".", 2)[2]  # "layers.<i>.<key>"
        if key in MCORE_BUFFERS_ONLY:
            continue
        if gqa and key.startswith("self_attn."):
            key = "self_attn." + _QKV.get(key[len("self_attn.") :], key[len("self_attn.") :])
        if key not in MCORE_LAYER_ORDER:
            raise ValueError(
                f"{p.name}: no place in megatron-core's layer order (memory_plan.MCORE_LAYER_ORDER)"
            )
        slots = layers.setdefault(p.layer, {})
        slots[key] = slots.get(key, 0) + n
    dense = [n for layer in sorted(x for x in outer if x < 0) for n in outer[layer]]
    for i in sorted(layers):
        dense += [layers[i][k] for k in MCORE_LAYER_ORDER if k in layers[i]]
    dense += [n for layer in sorted(x for x in outer if x >= 0) for n in outer[layer]]
    per = spec.num_experts // train.ep if spec.num_experts else 0
    experts = [
        numel(e.shape)
        for layer in spec.moe_layers
        if train.stage_of_layer(layer, spec.num_layers) == stage
        for _ in range(per)
        for e in spec.expert_params
    ]
    return dense, experts


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


@dataclass(frozen=True)
class GradBuffer:
    """megatron-core 0.12.1's _ParamAndGradBuffer of one parameter group (dense, or expert-parallel) as verl builds
    it (overlap_grad_reduce=False: one bucket): the parameters laid out in reverse order, with the distributed
    optimizer each starting at a multiple of 64 elements and the end padded to lcm(DP, 128); `numel` is the padded
    size of the param buffer (bf16) and of the grad buffer (fp32), `owned[r]` the parameter elements in DP rank r's
    contiguous 1/DP of it, which the distributed optimizer keeps fp32 main weights and Adam's m and v of."""

    numel: int
    params: int
    owned: tuple[int, ...]

    @classmethod
    def of(cls, sizes: list[int], dp: int, distributed: bool) -> GradBuffer:
        if not sizes:
            return cls(0, 0, (0,) * dp)
        if not distributed:  # no padding; every rank keeps main weights and moments of every parameter
            total = sum(sizes)
            return cls(total, total, (total,) * dp)
        ranges, start = [], 0
        for n in reversed(sizes):
            start = _pad(start, 64)
            ranges.append((start, start + n))
            start += n
        size = _pad(start, math.lcm(dp, 128))
        shard = size // dp
        owned = tuple(
            sum(max(0, min(end, (r + 1) * shard) - max(beg, r * shard)) for beg, end in ranges)
            for r in range(dp)
        )
        return cls(size, sum(sizes), owned)


def mcore_rank_groups(rank: int, lay: Layout) -> tuple[int, int, int]:
    """(PP stage, DP rank, expert-DP rank) of a global rank in megatron-core's default order tp-cp-ep-dp-pp (CP 1,
    expert TP 1): within a stage, rank = tp_rank + TP x dp_rank = ep_rank + EP x expert_dp_rank."""
    per_stage = lay.world // lay.pp
    local = rank % per_stage
    return rank // per_stage, local // lay.tp, local // lay.ep


def fsdp2_shards(sh: Shapes, world: int, rank: int, divisible_dim: bool = False) -> tuple[int, int]:
    """(padded, local) elements one FSDP2 rank holds of every parameter of the Hugging Face model: fully_shard
    splits each parameter on dim 0 with torch.chunk's rule, stores every rank's shard padded to the first chunk's
    rows (FSDPParam._sharded_param_data) and hands out the unpadded view; torch.zeros_like of that view (AdamW's
    states) is unpadded. Fused names of the plan (gate_up_proj, the experts' w1) are two parameters there.
    divisible_dim: verl's legacy fsdp_workers (0.6.0 / 0.7.1) pass fully_shard a shard_placement_fn that splits
    each parameter on its first dim the world divides, dim 0 only when none does (fsdp_utils.get_shard_placement_fn,
    0.7.1 fsdp_workers.py:632), so an odd vocabulary's embedding splits on hidden, unpadded; verl 0.9.1's FSDP
    engine passes none (engine/fsdp/transformer_impl.py:465-470): dim 0, padded."""

    def parts(name: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        if name.endswith("gate_up_proj") or name.endswith("experts.w1"):
            return [(shape[0] // 2, *shape[1:])] * 2
        return [shape]

    shapes_ = [q for p in sh.spec.dense_params for q in parts(p.name, p.shape)]
    for _ in sh.spec.moe_layers:
        for _ in range(sh.spec.num_experts):
            shapes_ += [q for e in sh.spec.expert_params for q in parts(e.name, e.shape)]
    padded = local = 0
    for shape in shapes_:
        if divisible_dim and any(d % world == 0 for d in shape):
            # a dim the world divides: every rank holds numel / world, nothing padded
            padded += numel(shape) // world
            local += numel(shape) // world
            continue
        rows, rest = shape[0], numel(shape[1:])
        chunk = -(-rows // world)
        padded += chunk * rest
        local += max(0, min(chunk, rows - rank * chunk)) * rest
    return padded, local


def _rollout_weights(sh: Shapes, lay: Layout, dtype_bytes: int = 2) -> int:
    """Bytes one rollout rank holds: dense weights split over the rollout's TP, experts over its EP, at the
    rollout's dtype (bf16 by default; a weight kept in fp32, the router's bias, stays fp32)."""
    spec = sh.spec

    def size(dtype: str) -> int:
        return max(dtype_bytes, mr.DTYPE_BYTES[dtype]) if dtype == "float32" else dtype_bytes

    def padded(p: mr.DenseParam) -> mr.DenseParam:
        # vLLM pads the vocabulary of its embedding and LM head to a multiple of 64
        # (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE) before splitting it over TP
        if p.name not in ("embed_tokens", "lm_head"):
            return p
        rows = -(-p.shape[0] // VOCAB_PADDING) * VOCAB_PADDING
        return mr.DenseParam(p.name, (rows, *p.shape[1:]), p.tp_dim, p.dtype, p.layer)

    dense = sum(numel(padded(p).shard_shape(lay.rollout_tp)) * size(p.dtype) for p in spec.dense_params)
    per = spec.num_experts // lay.rollout_ep if spec.num_experts else 0
    experts = len(spec.moe_layers) * per * sum(numel(e.shape) for e in spec.expert_params) * dtype_bytes
    return dense + experts


def _layer_work(sh: Shapes, tokens: int, split: int) -> int:
    """Estimate: one decoder layer's live bf16 tensors for `tokens` tokens (attention ~8 hidden-wide tensors,
    the MLP's gate/up/act ~3 FFN-wide ones), over the split (TP with sequence parallel)."""
    return _b(tokens * (8 * sh.hidden + 3 * sh.ffn) * 2 / split)


def _logits(sh: Shapes, tokens: int, split: int) -> int:
    """Estimate: the logits of `tokens` tokens in bf16 plus verl's fp32 log-softmax of them."""
    return _b(tokens * sh.vocab * (2 + 4) / split)


@dataclass
class TrainingState:
    """What the actor and the reference hold on a die of the planned stage, and where each part is kept."""

    actor_w: Term
    grads: Term
    optim: Term
    ref_w: Term
    param_b: int
    p_off: bool  # actor weights offloaded between phases
    g_off: bool  # gradients offloaded
    o_off: bool  # optimizer states offloaded
    ref_off: bool  # reference weights offloaded
    rank_terms: dict[int, dict[str, int]]
    main_grads: Term | None = None  # Megatron's fp32 copy of bf16 grads in the optimizer step


def _megatron_state(s: Mapping[str, Any], sh: Shapes, lay: Layout, stage: int, train_layout) -> TrainingState:
    """Megatron: the DDP buffers of the stage's ranks, the distributed optimizer's parts, MindSpeed's swap."""
    a = "actor_rollout_ref.actor."
    m, mref = a + "megatron.", "actor_rollout_ref.ref.megatron."
    rank_terms: dict[int, dict[str, int]] = {}
    main_grads: Term | None = None
    # bf16 weights; an fp32 grad buffer unless override_ddp_config.grad_reduce_in_fp32=False (verl sets it True;
    # the original system's MindSpeed trainer left Megatron's accumulate_allreduce_grads_in_fp32 at False)
    # (verl 0.9.1's engine: an explicit override_ddp_config.grad_reduce_in_fp32 wins, else True unless the
    # precision-aware optimizer reduces in a lower main_grads_dtype: engine/megatron/transformer_impl.py:439-463)
    grad_fp32 = bool(s[m + "override_ddp_config.grad_reduce_in_fp32"])
    param_b, grad_b = 2, (4 if grad_fp32 else 2)
    # fp32 main weights + Adam's m and v per owned value; verl 0.9.1's engine builds the model at
    # actor.megatron.dtype (bfloat16 by default, _generated_ppo_megatron_trainer.yaml:84; float32 on the CPU with
    # the overlay's cpu-0016): fp32 weights and grad buffer, and the distributed optimizer's main weights are views
    # of the param buffer, no copy (megatron-core 0.16.1 optimizer/distrib_optimizer.py:419-425), so 8 B
    opt_b = 12
    if megatron_engine(s) and str(s[m + "dtype"]) in ("float32", "fp32"):
        param_b, grad_b, opt_b = 4, 4, 8
    # the reference: verl 0.9.1's engine builds it at ref.megatron.dtype (the shape check found the fp32 CPU
    # reference planned at bf16); 0.6.0 / 0.7.1 build it bf16
    ref_b = 4 if megatron_engine(s) and str(s.get(mref + "dtype")) in ("float32", "fp32") else 2
    # verl's DDP wrapper (megatron_utils.get_model): one param + grad buffer for the dense parameters and one for
    # the routed experts (not all-reduced over DP: sharded over expert DP); the distributed optimizer keeps fp32
    # main weights + Adam's two moments of the elements in its rank's part of each
    dist = bool(s[m + "use_distributed_optimizer"])
    dense_sizes, expert_sizes = mcore_params(
        sh, lay.tp, stage, train_layout, local_spec=str(s.get("_mcore_spec") or "te") == "local"
    )
    dense_buf = GradBuffer.of(dense_sizes, lay.dp, dist)
    expert_buf = GradBuffer.of(expert_sizes, lay.expert_dp, dist)
    dense_n, expert_n = dense_buf.params, expert_buf.params
    n_local = dense_n + expert_n
    n_buf = dense_buf.numel + expert_buf.numel
    swap = 16 if bool(s[m + "override_transformer_config.swap_optimizer"]) else 1
    owned = 0  # the most parameter values a rank of the stage owns in the distributed optimizer
    for rank in range(lay.world):
        st, dp_rank, edp_rank = mcore_rank_groups(rank, lay)
        if st == stage:
            rank_owned = dense_buf.owned[dp_rank] + expert_buf.owned[edp_rank]
            owned = max(owned, rank_owned)
            rank_terms[rank] = {
                "weights": n_buf * param_b if dist else n_local * param_b,
                "gradients": n_buf * grad_b,
                "optimizer_states": opt_b * rank_owned // swap,
            }
    opt = max(t["optimizer_states"] for t in rank_terms.values())
    if dist and grad_b == 2:
        # the step casts the rank's part of the bf16 grads to fp32 grads of its main weights (Megatron's
        # distributed optimizer, _copy_model_grads_to_main_grads); freed after the step
        main_grads = Term(
            "fp32 main grads",
            4 * owned // swap,
            "the optimizer step's fp32 copy of the rank's part of the bf16 grads (activations freed)"
            + (f", 1/{swap} at a time with swap_optimizer" if swap > 1 else ""),
            estimate=True,
        )
    mains = (
        "fp32 main weights + Adam m, v (12 B/param)" if opt_b == 12 else "Adam m, v (8 B/param; fp32 weights)"
    )
    opt_how = (
        f"{mains} of the rank's part of the DDP buffers (distributed "
        f"optimizer: dense / DP{lay.dp}, experts / expert-DP{lay.expert_dp}), the largest over the stage's ranks"
        if dist
        else f"{mains} of every local parameter"
    )
    if swap > 1:
        opt_how += (
            f"; MindSpeed swap_optimizer keeps it on the host, 1/{swap} swapped in at a time (estimate)"
        )
    p_off, g_off, o_off = (bool(s[m + k]) for k in ("param_offload", "grad_offload", "optimizer_offload"))
    if megatron_engine(s):
        # verl 0.9.1 has no grad_offload: the engine moves the grad buffer with the weights (its train mode's
        # context switch passes grad=is_param_offload_enabled, engine/base.py:322-328, and the engine's init
        # likewise, engine/megatron/transformer_impl.py:650-655), and offloading the model frees the grad buffer
        # (utils/megatron_utils.py:770-773: grad_data.storage().resize_(0)), reloading it zeroed, not copied
        # (:816-820). Without param_offload both buffers stay on the die through every phase.
        g_off = p_off
    shard = f"TP{lay.tp} PP{lay.pp} (stage {stage}) EP{lay.ep}"
    pad = f" in DDP buffers padded to {n_buf / 1e9:.3f}B" if dist and n_buf != n_local else ""
    return TrainingState(
        actor_w=Term(
            "actor weights",
            (n_buf if dist else n_local) * param_b,
            f"{n_local / 1e9:.3f}B params x {param_b} B{pad}, {shard}",
        ),
        grads=Term(
            "actor gradients",
            n_buf * grad_b,
            f"{'fp32' if grad_fp32 else 'bf16'} grad buffer{pad} (grad_reduce_in_fp32={grad_fp32}), {shard}",
        ),
        optim=Term("optimizer states", _b(opt), opt_how),
        # (verl 0.9.1: the reference is a MegatronEngine with forward_only, built without DDP, engine/megatron/
        # transformer_impl.py:470-473, offloaded at init when ref.megatron.param_offload, :601-606, and loaded for
        # its forward only, in eval mode, engine/base.py:320-321: the same bytes)
        ref_w=Term(
            "reference weights",
            n_local * ref_b,
            f"{'fp32' if ref_b == 4 else 'bf16'}, {shard} (no DDP wrapper)",
        ),
        param_b=param_b,
        p_off=p_off,
        g_off=g_off,
        o_off=o_off,
        ref_off=bool(
            p_off if s[mref + "param_offload"] is None and megatron_engine(s) else s[mref + "param_offload"]
        ),
        rank_terms=rank_terms,
        main_grads=main_grads,
    )


def _fsdp_state(s: Mapping[str, Any], sh: Shapes, lay: Layout) -> TrainingState:
    """FSDP2 (each parameter split on one dim, padded where the world does not divide it: fsdp2_shards) or FSDP1
    (flat parameters padded to the world)."""
    f = "actor_rollout_ref.actor.fsdp_config."
    param_b = 4 if str(s[f + "model_dtype"]) in ("fp32", "float32") else 2
    grad_b = param_b
    rank_terms: dict[int, dict[str, int]] = {}
    if lay.strategy == "fsdp2":
        # every parameter split on one dim, each shard stored padded to the first shard's rows; Adam's states
        # (zeros_like the unpadded shard) are not
        divisible = not engine_workers(s)  # the legacy workers' shard_placement_fn (fsdp2_shards)
        padded = fsdp2_shards(sh, lay.world, 0, divisible)[0]
        for rank in range(lay.world):
            rank_terms[rank] = {
                "weights": padded * param_b,
                "gradients": padded * grad_b,
                "optimizer_states": 2 * param_b * fsdp2_shards(sh, lay.world, rank, divisible)[1],
            }
        n_local = padded
        opt = max(t["optimizer_states"] for t in rank_terms.values())
        shard = f"FSDP2 over {lay.world}, " + (
            "each parameter's first dim the world divides" if divisible else "each parameter's dim 0"
        )
    else:
        n_local = -(-total_params(sh) // lay.world)  # FSDP1's flat parameters, each padded to the world
        opt = 2 * param_b * n_local
        shard = f"FSDP over {lay.world}"
    ref_w, ref_off = (
        Term("reference weights", n_local * 2, f"bf16, {shard}"),
        bool(s["actor_rollout_ref.ref.fsdp_config.param_offload"]),
    )
    if engine_workers(s):
        # verl 0.9.1's reference is an engine of its own with forward_only (_generated_ppo_trainer.yaml:258): FSDP2
        # wraps it with CPUOffloadPolicy, FSDP1 with CPUOffload(offload_params=True) (engine/fsdp/
        # transformer_impl.py:431-435, :459-463), whatever ref.fsdp_config.param_offload says: its shards stay on
        # the host and each wrapped module is gathered onto the die for its forward only
        ref_w, ref_off = _streamed_reference(sh), True
    return TrainingState(
        actor_w=Term(
            "actor weights", n_local * param_b, f"{n_local / 1e9:.3f}B params x {param_b} B, {shard}"
        ),
        grads=Term("actor gradients", n_local * grad_b, f"{grad_b} B/param, {shard}"),
        optim=Term(
            "optimizer states", _b(opt), f"AdamW m, v at the weights' dtype ({2 * param_b} B/param), {shard}"
        ),
        ref_w=ref_w,
        param_b=param_b,
        p_off=bool(s[f + "param_offload"]),
        g_off=False,  # FSDP's gradients are made by the backward pass and freed by zero_grad, never moved
        o_off=bool(s[f + "optimizer_offload"]),
        ref_off=ref_off,
        rank_terms=rank_terms,
    )


def _streamed_reference(sh: Shapes) -> Term:
    """Estimate: what a host-offloaded FSDP reference (verl 0.9.1's forward-only engine) holds on the die in its
    forward: the root module's parameters (embedding, final norm, LM head), which FSDP2 keeps gathered through the
    forward (verl's apply_fsdp2 does not reshard the root, utils/fsdp_utils.py:600), and two decoder layers gathered
    at once (the one running and the next, prefetched), each whole, in bf16 (the mixed-precision param_dtype)."""
    n = sh.spec.num_layers
    root = sum(numel(p.shape) for p in sh.spec.dense_params if p.layer < 0 or p.layer >= n)
    layers: dict[int, int] = {}
    for p in sh.spec.dense_params:
        if 0 <= p.layer < n:
            layers[p.layer] = layers.get(p.layer, 0) + numel(p.shape)
    experts = sh.spec.num_experts * sum(numel(e.shape) for e in sh.spec.expert_params)
    biggest = max((v + (experts if i in sh.spec.moe_layers else 0) for i, v in layers.items()), default=0)
    return Term(
        "reference weights",
        (root + 2 * biggest) * 2,
        "estimate: offloaded to the host (forward-only engine); in its forward the root module's weights and two "
        "decoder layers', gathered whole, bf16",
        estimate=True,
    )


@dataclass
class RolloutTerms:
    """The vLLM engine on the die: its weights, the profile run's peak and the KV cache it sizes from them."""

    weights: Term
    activations: Term
    kv: Term
    kv_token: int  # one token's K and V of one layer on one rollout rank
    blocks: int
    block: int


def _rollout_terms(
    s: Mapping[str, Any], sh: Shapes, lay: Layout, die: Die, state: TrainingState
) -> RolloutTerms:
    """The KV cache by the rule of the vLLM-Ascend the base pins (vllm_ascend()), NPUWorker.determine_available_memory:
    0.13.0: the die's memory x utilisation, less the profile run's peak and everything else allocated on the die
    (other processes' too) when the engine starts; 0.23.0.post1: the die's memory x utilisation less the engine's own
    weights and profile peak, and the engine refuses to start unless that share of the die is free then."""
    r = "actor_rollout_ref.rollout."
    roll_bytes = ROLLOUT_DTYPE_BYTES.get(str(s[r + "dtype"]), 2)
    roll_w = _rollout_weights(sh, lay, roll_bytes)
    weights = Term(
        "rollout weights",
        roll_w,
        f"{s[r + 'dtype']}, dense / TP{lay.rollout_tp}, experts / EP{lay.rollout_ep} (vLLM, PP1)",
    )
    tokens_budget = int(s[r + "max_num_batched_tokens"])
    seqs = int(s[r + "max_num_seqs"])
    act = Term(
        "rollout activations",
        _layer_work(sh, tokens_budget, lay.rollout_tp) + seqs * sh.vocab * 4,
        f"estimate: one layer for max_num_batched_tokens {tokens_budget} + the sampler's fp32 logits for "
        f"max_num_seqs {seqs} (vLLM's profile run)",
        estimate=True,
    )
    util = float(s[r + "gpu_memory_utilization"])
    at_start = [state.actor_w] if not state.p_off else []
    if not state.ref_off:
        at_start.append(state.ref_w)
    held = sum(t.nbytes for t in at_start)
    share = _b(die.memory * util)
    if vllm_ascend(s) == "0.23.0.post1":
        # vllm_ascend/worker/worker.py (0.23.0.post1 sdist): init_device takes a snapshot of the die and asks for
        # total x gpu_memory_utilization (:465-469), refusing to start when less is free (:470-480);
        # determine_available_memory gives the KV cache that request less the weights, the profile run's torch peak
        # and the non-torch increase since the snapshot (:557-574, :590), vLLM 0.23's memory_profiling
        # (vllm/utils/mem_utils.py:243-274): what other processes held at the snapshot is not subtracted
        kv = max(0, share - roll_w - act.nbytes)
        less = "the engine's weights and profile peak"
        # (its start-up check needs no term of its own: what the die holds at the start plus the engine's share is
        # in the generation phase, so a start it would refuse is a peak over the die)
        rule = f"vLLM-Ascend 0.23.0.post1 (which needs {util:g} x the die free at engine start)"
    else:
        # vllm_ascend/worker/worker.py (0.13.0 wheel) :269-311: total x utilisation less the torch peak of the
        # profile run plus every non-torch allocation on the die (mem_get_info's used less torch's), other
        # processes' included
        kv = max(0, share - roll_w - act.nbytes - held)
        less = (
            "the engine's weights, profile peak and "
            f"{' + '.join(t.name for t in at_start) or 'nothing else'} at engine start"
        )
        rule = "vLLM-Ascend 0.13.0"
    if s.get("_vllm_mla_disable") and sh.kv_unabsorbed_bytes_per_token_layer:
        kv_token = sh.kv_unabsorbed_bytes_per_token_layer * roll_bytes // 2 // lay.rollout_tp
    else:
        kv_token = (
            sh.kv_bytes_per_token_layer * roll_bytes // 2 // (lay.rollout_tp if sh.kv_split_by_tp else 1)
        )
    # vLLM 0.23: kv_cache_utils.get_num_blocks (v1/core/kv_cache_utils.py:967) floors bytes / page / layers, as 0.13
    block = int(s[r + "block_size"])
    blocks = kv // (block * kv_token * sh.spec.num_layers) if kv_token else 0
    kv_t = Term(
        "KV cache",
        kv,
        f"{rule}: {util:g} x {die.memory / GIB:.0f} GiB less {less}: {blocks} blocks of {block} "
        f"tokens ({kv_token * sh.spec.num_layers} B/token) = {blocks * block} tokens",
    )
    return RolloutTerms(weights, act, kv_t, kv_token, blocks, block)


def _activation_terms(
    s: Mapping[str, Any], sh: Shapes, lay: Layout, stage: int, train_layout
) -> tuple[Term, Callable[[str, str], Term]]:
    """Estimates: the update's activations on the stage (1F1B in flight, checkpointing) and a forward pass's."""
    a, r = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    seq = int(s["data.max_prompt_length"]) + int(s["data.max_response_length"])
    n_layers_here = (
        sum(
            1
            for i in range(sh.spec.num_layers)
            if train_layout.stage_of_layer(i, sh.spec.num_layers) == stage
        )
        if train_layout
        else sh.spec.num_layers
    )
    last_stage = stage == lay.pp - 1
    mb = int(s[a + "ppo_micro_batch_size_per_gpu"])
    t_train = mb * seq
    ckpt = bool(s["actor_rollout_ref.model.enable_gradient_checkpointing"])
    recomputed = n_layers_here if ckpt else 0
    if lay.strategy == "megatron":
        # Megatron recomputes what override_transformer_config asks (every base: verl's megatron workers and
        # engine read no enable_gradient_checkpointing; megatron_layout.Recompute: block recomputes the stage's
        # first recompute_num_layers layers, uniform all of them)
        recomputed = megatron_layout.recompute(s).layers_recomputed(n_layers_here)
        ckpt = recomputed > 0
    # 1F1B: stage s holds up to pp - s micro-batches' activations (fewer when the mini-batch has fewer)
    n_micro = max(
        1, int(s.get(a + "ppo_mini_batch_size", mb) or mb) * int(s.get(r + "n", 1) or 1) // (mb * lay.dp)
    )
    inflight = min(lay.pp - stage, n_micro) if lay.pp > 1 else 1
    if ckpt:
        kept = n_layers_here - recomputed  # layers outside the recompute keep their activations
        stored = (
            recomputed * t_train * sh.hidden * 2 // lay.tp
            + kept * _layer_work(sh, t_train, lay.tp)
            + _layer_work(sh, t_train, lay.tp)
        )
        how = f"{recomputed} checkpointed layer inputs + one layer recomputed" + (
            f" + {kept} layers' activations" if kept else ""
        )
    else:
        stored = n_layers_here * _layer_work(sh, t_train, lay.tp)
        how = f"{n_layers_here} layers' activations"
    train_act = Term(
        "activations (update)",
        stored * inflight + (_logits(sh, t_train, lay.tp) if last_stage else 0),
        f"estimate: micro-batch {mb} x {seq} tokens, {how}"
        + (f", {inflight} micro-batches in flight (1F1B)" if inflight > 1 else "")
        + (", logits" if last_stage else ""),
        estimate=True,
    )

    def fwd_act(key: str, label: str) -> Term:
        mbf = int(s[key])
        t = mbf * seq
        return Term(
            label,
            _layer_work(sh, t, lay.tp) + (_logits(sh, t, lay.tp) if last_stage else 0),
            f"estimate: forward only, micro-batch {mbf} x {seq} tokens, one layer live"
            + (", logits" if last_stage else ""),
            estimate=True,
        )

    return train_act, fwd_act


def _reshard_terms(
    s: Mapping[str, Any], sh: Shapes, lay: Layout, train_layout, param_b: int, roll_w: int, facts: list
) -> list[Term]:
    """The weight sync's transient buffers: routed experts (the AlltoAllV plan or the EP all-gather), the largest
    dense tensor's gather and cast, and the server-mode sync's bucket."""
    r = "actor_rollout_ref.rollout."
    reshard: list[Term] = []
    method = str(s[r + "expert_reshard"])
    if sh.spec.num_experts and lay.strategy == "megatron":
        w1 = max(sh.spec.expert_params, key=lambda e: e.nbytes)
        ex_plan = mr.plan_experts(
            train_layout, mr.RolloutLayout(lay.world, ep=lay.rollout_ep), sh.spec.num_experts
        )
        if method == mr.ALLTOALLV and ex_plan.method == mr.ALLTOALLV:
            extra = max(
                mr.expert_step_traffic(ex_plan, rank, st, w1.nbytes)["extra"]
                for rank in range(lay.world)
                for st in range(lay.pp)
            )
            how = f"AlltoAllV plan (moe_reshard.expert_step_traffic): peak extra of one layer's {w1.name}, max over ranks"
        else:
            extra = max(
                kw["extra"]
                for rank in range(lay.world)
                for st in range(lay.pp)
                for _, kw in mr.baseline_step_traffic(train_layout, sh.spec.num_experts, rank, st, w1.nbytes)
            )
            how = f"all-gather over EP{lay.ep} (moe_reshard.baseline_step_traffic): every expert of one layer's {w1.name}"
        reshard.append(Term("reshard buffer, routed experts", extra, how))
        facts.append(("reshard increment", f"{extra / GIB:.4f} GiB per die ({method})"))
    big = max(sh.spec.dense_params, key=lambda p: p.nbytes)
    if lay.strategy == "megatron" and lay.tp > 1:
        reshard.append(
            Term(
                "reshard buffer, dense",
                2 * big.nbytes,
                f"verl's per_tensor_generator: the TP all-gather's parts and their concatenation of {big.name}",
            )
        )
    else:
        n_big = numel(big.shape)
        gather = n_big * param_b if lay.world > 1 else 0  # FSDP's full_tensor of the sharded weight
        cast = n_big * 2 if param_b != 2 else 0  # its bf16 copy for the engine
        # the engine's FSDP2 export with the weights offloaded: the tensor's shard copied onto the die first
        staged = -(-n_big // lay.world) * param_b if _streamed_sync(s) else 0
        if gather + cast + staged:
            reshard.append(
                Term(
                    "reshard buffer, dense",
                    gather + cast + staged,
                    f"full {big.name}: "
                    + ("its shard copied from the host, " if staged else "")
                    + f"gathered at {param_b} B and cast to bf16",
                )
            )
    bucket = int(s[r + "update_weights_bucket_megabytes"]) * MIB
    if bucket and str(s[r + "mode"]) == "async":
        reshard.append(
            Term(
                "weight bucket",
                min(bucket, roll_w),
                "the server-mode sync's bucket (update_weights_bucket_megabytes)",
            )
        )
    return reshard


def alltoallv_call_extra(plan: mr.ExpertPlan, expert_nbytes: int) -> int:
    """The largest transient bytes one rank holds in one collective of patch ds-0206's AlltoAllV export on verl
    0.9.1: llm_rl/deepseek_r1/verl_modules/expert_reshard.py routes each routed-expert conversion task of the
    bridge (one local expert's tensor of one layer and parameter) through moe_reshard.route_expert_tensor, one
    all_to_all_single per (layer, parameter, local expert id): its receive buffer plus, when the rank sends that
    tensor to several ranks, the packed send buffer (moe_reshard.tensor_step_traffic's `extra`), max over ranks,
    stages and local ids. Every move of a call local: no buffer."""
    per = plan.num_experts // plan.train.ep
    world = plan.train.world_size
    worst = 0
    for stage in range(plan.train.pp):
        for lid in range(per):
            moves = mr.tensor_moves(plan, stage, lid)
            if all(m.src == m.dst for m in moves):
                continue
            sends, recvs = [0] * world, [0] * world
            for m in moves:
                sends[m.src] += 1
                recvs[m.dst] += 1
            for rank in range(world):
                extra = (sends[rank] if sends[rank] > 1 else 0) + recvs[rank]
                worst = max(worst, extra * expert_nbytes)
    return worst


def _bridge_reshard_terms(
    s: Mapping[str, Any], sh: Shapes, lay: Layout, train_layout, roll_w: int, facts: list
) -> list[Term]:
    """verl 0.9.1's weight sync through Megatron-Bridge 0.3.1 (engine_workers.update_weights, engine_workers.py:786
    -> MegatronEngine.get_per_tensor_param, engine/megatron/transformer_impl.py:1033-1054 -> export_hf_weights,
    megatron/bridge/models/conversion/model_bridge.py:952-998): one conversion task at a time, each converted on
    every rank and its dict of HF tensors held while the consumer copies them into the sync's bucket.

    Routed experts, the bridge's export (rollout.expert_reshard=allgather): a task is ONE local expert of one layer
    and parameter (model_bridge.py:155). GatedMLPMapping.megatron_to_hf (param_mapping.py:2034-2076) broadcasts its
    fused gate/up tensor from the owning PP stage (a buffer of it on every other stage: param_mapping.py:293-373;
    made on "cuda" when torch.cuda is available, :360, else on the host, where HCCL could not broadcast it: counted on
    the die),
    splits it (torch.chunk, views) and all-gathers gate, then up, over EP (gather_from_ep_ranks, :692-694: EP
    empty_like buffers each), both dicts alive until the task's tensors are yielded: (EP + 1 if PP > 1) x one
    expert's w1 at the peak, not every expert of the layer (the legacy per_tensor_generator's figure).
    AlltoAllV (patch ds-0206): alltoallv_call_extra. Dense: ColumnParallelMapping.megatron_to_hf (:838-863): the PP
    broadcast's buffer of the rank's TP shard, the TP all-gather's shards and their concatenation (torch.cat) of
    the largest weight. The bucket: BucketedWeightSender's device buffer (vllm_rollout/vllm_rollout.py:235-241,
    bucketed_weight_transfer.py:183), checkpoint_engine.update_weights_bucket_megabytes."""
    r = "actor_rollout_ref.rollout."
    reshard: list[Term] = []
    method = str(s[r + "expert_reshard"])
    if sh.spec.num_experts:
        w1 = max(sh.spec.expert_params, key=lambda e: e.nbytes)
        ex_plan = mr.plan_experts(
            train_layout, mr.RolloutLayout(lay.world, ep=lay.rollout_ep), sh.spec.num_experts
        )
        if method == mr.ALLTOALLV and ex_plan.method == mr.ALLTOALLV:
            extra = alltoallv_call_extra(ex_plan, w1.nbytes)
            how = (
                f"patch ds-0206's AlltoAllV (expert_reshard.py, moe_reshard.route_expert_tensor): one local "
                f"expert's {w1.name} per collective, receive + pack buffers, max over ranks"
            )
            label = "alltoallv"
        else:
            copies = lay.ep + (1 if lay.pp > 1 else 0)
            extra = copies * w1.nbytes
            how = (
                f"Megatron-Bridge's export: one local expert's {w1.name} all-gathered over EP{lay.ep} "
                f"(gather_from_ep_ranks, gate and up)" + (" + its PP broadcast buffer" if lay.pp > 1 else "")
            )
            label = "bridge all-gather"
            if method == mr.ALLTOALLV:
                label += f" (the AlltoAllV plan falls back: {ex_plan.reason})"
        reshard.append(Term("reshard buffer, routed experts", extra, how))
        facts.append(("reshard increment", f"{extra / GIB:.4f} GiB per die ({label})"))
    big = max(sh.spec.dense_params, key=lambda p: p.nbytes)
    full = big.nbytes
    bcast = -(-full // lay.tp) if lay.pp > 1 else 0
    gathered = 2 * full if lay.tp > 1 else 0
    if bcast + gathered:
        reshard.append(
            Term(
                "reshard buffer, dense",
                bcast + gathered,
                f"Megatron-Bridge's export of {big.name}: "
                + ("its TP shard's PP broadcast buffer, " if bcast else "")
                + ("the TP all-gather's shards and their concatenation" if gathered else ""),
            )
        )
    bucket = int(s[r + "update_weights_bucket_megabytes"]) * MIB
    if bucket:
        reshard.append(
            Term(
                "weight bucket",
                min(bucket, roll_w),
                "the sync's device bucket (checkpoint_engine.update_weights_bucket_megabytes)",
            )
        )
    return reshard


def _streamed_sync(s: Mapping[str, Any]) -> bool:
    """Whether the weight sync leaves offloaded actor weights on the host and moves one tensor at a time: verl
    0.9.1's FSDP engine on FSDP2 without LoRA skips loading the whole model (engine/fsdp/transformer_impl.py:988-991)
    and copies each parameter's shard onto the die as the sync consumes it (:1027-1033)."""
    return (
        engine_workers(s)
        and str(s["actor_rollout_ref.actor.strategy"]) == "fsdp2"
        and bool(s["actor_rollout_ref.actor.fsdp_config.param_offload"])
    )


def _phases(
    s: Mapping[str, Any],
    state: TrainingState,
    roll: RolloutTerms,
    train_act: Term,
    fwd_act: Callable[[str, str], Term],
    reshard: list[Term],
    *,
    explicit: bool,
    free_cache: bool,
    rollout_released: bool,
    facts: list,
    engine: bool = False,
) -> list[Phase]:
    """What the die holds in each phase of the step and each transition between them, in verl's order.
    `engine`: verl 0.9.1's MegatronEngine (megatron_engine()): its train mode's exit offloads the weights and frees
    the grad buffer whatever the rollout does (engine/base.py:334-335), and its update_weights loads the weights
    back without the grads for the export and offloads them after it (engine/megatron/transformer_impl.py:1040,
    engine_workers.py:811-812), so the explicit offload changes the rollout's side only; without param_offload the
    grad buffer stays on the die in every phase; the grads are freed and re-made zeroed, never copied."""
    actor_w, grads, optim, ref_w = state.actor_w, state.grads, state.optim, state.ref_w
    p_off, g_off, o_off, ref_off = state.p_off, state.g_off, state.o_off, state.ref_off
    grads_resident = [grads] if engine and not p_off else []
    grads_moved = 0 if engine else grads.nbytes
    if engine:
        explicit = False  # for the actor's weights (above); the rollout's release is decided by the caller
    rollout_w, kv_t, roll_w = roll.weights, roll.kv, roll.weights.nbytes
    opt_resident = [] if o_off else [optim]
    actor_resident_gen = [] if p_off else [actor_w, *grads_resident]
    ref_resident = [] if ref_off else [ref_w]
    stay = [] if rollout_released else [rollout_w, kv_t]
    released_note = (
        "" if rollout_released else " (sleep mode left the rollout's weights and KV cache on the die)"
    )
    recompute = bool(s["actor_rollout_ref.actor.recompute_old_log_prob"])
    streamed = _streamed_sync(s)
    phases = [
        Phase(
            "generation",
            [rollout_w, kv_t, roll.activations, *actor_resident_gen, *opt_resident, *ref_resident],
        ),
        Phase(
            "offload rollout",
            [*stay, *actor_resident_gen, *opt_resident, *ref_resident],
            "transition",
            moved=roll_w if rollout_released and free_cache else 0,
            note="rollout weights to the host, KV cache freed" + released_note,
        ),
        Phase(
            "reference forward",
            [
                *stay,
                ref_w,
                fwd_act("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "activations (forward)"),
                *actor_resident_gen,
                *opt_resident,
            ],
            moved=ref_w.nbytes if ref_off else 0,
            note="reference weights onloaded" if ref_off else "",
        ),
    ]
    if recompute:
        phases.append(
            Phase(
                "old-log-prob forward",
                [
                    *stay,
                    actor_w,
                    *grads_resident,
                    fwd_act(
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "activations (forward)"
                    ),
                    *opt_resident,
                    *ref_resident,
                ],
                moved=actor_w.nbytes if p_off else 0,
            )
        )
    else:
        facts.append(("old-log-prob forward", "skipped (actor.recompute_old_log_prob=False)"))
    main_grads = state.main_grads
    phases += [
        Phase(
            "onload actor",
            [*stay, actor_w, grads, optim, *ref_resident],
            "transition",
            moved=(actor_w.nbytes if p_off else 0)
            + (grads_moved if g_off else 0)
            + (optim.nbytes if o_off else 0),
            note="weights, gradients, optimizer states onto the die",
        ),
        Phase("actor update", [*stay, actor_w, grads, optim, train_act, *ref_resident]),
        *(
            [Phase("optimizer step", [*stay, actor_w, grads, optim, main_grads, *ref_resident])]
            if main_grads
            else []
        ),
        Phase(
            "offload actor",
            [
                *stay,
                *([actor_w] if (explicit or not p_off) else []),
                *grads_resident,
                *opt_resident,
                *ref_resident,
            ],
            "transition",
            moved=(optim.nbytes if o_off else 0) + (0 if explicit or not p_off else actor_w.nbytes),
            note="gradients freed; "
            + (
                "weights kept for the reshard (explicit offload)"
                if explicit and p_off
                else "offloaded as configured"
            ),
        ),
        Phase(
            "weight sync and reshard",
            [
                *([] if streamed else [actor_w]),
                *grads_resident,
                rollout_w,
                *reshard,
                *([kv_t] if not rollout_released else []),
                *opt_resident,
                *ref_resident,
            ],
            moved=(roll_w if rollout_released else 0)
            + (actor_w.nbytes if p_off and not explicit and not streamed else 0),
            note="rollout weights onloaded, actor weights exported into them"
            + (", one tensor at a time from the host" if streamed else ""),
        ),
        Phase(
            "onload KV cache",
            [rollout_w, kv_t, *actor_resident_gen, *opt_resident, *ref_resident],
            "transition",
            moved=actor_w.nbytes if p_off and not streamed else 0,
            note="actor weights offloaded, then the KV cache allocated"
            if p_off and not streamed
            else "KV cache allocated",
        ),
    ]
    return phases


def plan(
    s: Mapping[str, Any],
    cfg: Mapping[str, Any],
    die: Die,
    *,
    stage: int | None = None,
    rollout_released: bool | None = None,
) -> Plan:
    """The per-die plan of one GRPO step. `stage`: the PP stage to plan (default: the one that peaks);
    `rollout_released`: whether offloading the rollout frees its memory (default: yes, except without explicit
    offload on several NPU nodes, where the original found vLLM's sleep mode did not free it)."""
    sh = shapes(cfg)
    lay = _layout(s)
    if stage is None and lay.strategy == "megatron" and lay.pp > 1:
        plans = [plan(s, cfg, die, stage=st, rollout_released=rollout_released) for st in range(lay.pp)]
        worst = max(plans, key=lambda p: p.peak.total)
        worst.stage_plans = plans
        return worst
    stage = stage or 0
    r = "actor_rollout_ref.rollout."
    explicit = bool(s[r + "explicit_offload"])
    free_cache = bool(s[r + "free_cache_engine"]) or explicit
    if rollout_released is None:
        # without free_cache_engine the engine keeps its memory; with it, sleep mode frees it except on several
        # NPU nodes, where the original found it did not (the explicit offload does); `_sleep_frees` (plan_memory
        # --compare's row) plans sleep mode freeing it there too, as vLLM-Ascend's code says it does
        rollout_released = free_cache and (
            explicit
            or bool(s.get("_sleep_frees"))
            or int(s["trainer.nnodes"]) == 1
            or str(s["trainer.device"]) != "npu"
        )
    train_layout = (
        mr.TrainLayout(
            lay.world,
            tp=lay.tp,
            ep=lay.ep,
            pp=lay.pp,
            layers_per_stage=megatron_layout.pipeline_split(s, sh.spec.num_layers),
        )
        if lay.strategy == "megatron"
        else None
    )
    facts = [
        ("model", f"{total_params(sh) / 1e9:.2f}B parameters ({cfg.get('model_type')})"),
        ("die", f"{die.name}: {die.memory / GIB:.0f} GiB ({die.source})"),
    ]
    # the phase seams: training state, rollout engine, activations, reshard buffers, residency by phase
    state = (
        _megatron_state(s, sh, lay, stage, train_layout)
        if lay.strategy == "megatron"
        else _fsdp_state(s, sh, lay)
    )
    roll = _rollout_terms(s, sh, lay, die, state)
    facts.append(
        ("KV cache", f"{roll.kv.nbytes / GIB:.2f} GiB = {roll.blocks} blocks of {roll.block} tokens")
    )
    facts.append(
        ("KV rule", f"vLLM-Ascend {vllm_ascend(s)}'s (verl base {s.get('_verl') or '0.6.0 / 0.7.1'})")
    )
    train_act, fwd_act = _activation_terms(s, sh, lay, stage, train_layout)
    if megatron_engine(s):
        reshard = _bridge_reshard_terms(s, sh, lay, train_layout, roll.weights.nbytes, facts)
        # verl 0.9.1 forces sleep level 1 on an NPU (rollout/vllm_rollout/vllm_async_server.py:1289-1303), which
        # in vLLM-Ascend 0.23.0.post1 copies the weights to the host and unmaps the pool (worker.py:228)
        facts.append(
            (
                "rollout release",
                "explicit offload (rollout.explicit_offload)"
                if explicit
                else "sleep level 1 (verl 0.9.1 forces it on an NPU)"
                + ("" if rollout_released else ": planned as not freeing the die on several NPU nodes"),
            )
        )
    else:
        reshard = _reshard_terms(s, sh, lay, train_layout, state.param_b, roll.weights.nbytes, facts)
    phases = _phases(
        s,
        state,
        roll,
        train_act,
        fwd_act,
        reshard,
        explicit=explicit,
        free_cache=free_cache,
        rollout_released=rollout_released,
        facts=facts,
        engine=megatron_engine(s),
    )
    comms = 0
    if lay.world > 1:
        comms = (
            4 if lay.strategy == "megatron" else 1
        ) + 3  # Megatron TP/PP/EP/DP (or FSDP's), vLLM TP/DP/EP
    hint = ""
    if lay.strategy == "megatron" and sh.spec.num_experts and lay.expert_dp > 1:
        hint = (
            f"raise actor/ref megatron.expert_model_parallel_size (EP{lay.ep} keeps every expert on "
            f"{lay.expert_dp} dies; up to EP{lay.world // lay.pp} fits a stage), or shard or offload it otherwise"
        )
    return Plan(
        die,
        headroom_bytes(comms),
        phases,
        facts,
        stage,
        hint,
        kv_bytes_per_token=roll.kv_token * sh.spec.num_layers,
        rank_terms=state.rank_terms,
    )


# ----------------------------------------------------------------------------- printing


def table(p: Plan, gib: Callable[[int], str] = lambda n: f"{n / GIB:.2f}") -> str:
    """The plan as a Markdown table: one row per phase, its total and its terms."""
    rows = [
        f"Per die, {p.die.name}, {p.die.memory / GIB:.0f} GiB; peak **{gib(p.peak.total)} GiB** in "
        f"*{p.peak.name}*; limit {gib(p.limit)} GiB (headroom {gib(p.headroom)} GiB)"
        + (f"; PP stage {p.stage}" if p.stage else ""),
        "",
        "| phase | GiB | terms (GiB; ~ = estimate) | host<->die GiB |",
        "|---|---|---|---|",
    ]
    for ph in p.phases:
        name = ph.name if ph.kind == "phase" else f"→ {ph.name}"
        terms = ", ".join(
            f"{t.name} {'~' if t.estimate else ''}{gib(t.nbytes)}" for t in ph.terms if t.nbytes
        )
        rows.append(f"| {name} | {gib(ph.total)} | {terms or '-'} | {gib(ph.moved) if ph.moved else '-'} |")
    return "\n".join(rows)


def as_json(p: Plan) -> dict[str, Any]:
    return {
        "die": {"name": p.die.name, "bytes": p.die.memory, "source": p.die.source},
        "headroom": p.headroom,
        "limit": p.limit,
        "stage": p.stage,
        "peak": {"phase": p.peak.name, "bytes": p.peak.total, "largest": p.peak.largest().name},
        "phases": [
            {
                "name": ph.name,
                "kind": ph.kind,
                "bytes": ph.total,
                "moved": ph.moved,
                "note": ph.note,
                "terms": [
                    {"name": t.name, "bytes": t.nbytes, "how": t.how, "estimate": t.estimate}
                    for t in ph.terms
                ],
            }
            for ph in p.phases
        ],
        "facts": dict(p.facts),
    }


def die_for(settings: Mapping[str, Any], name: str | None = None) -> Die:
    """The die to plan against: named, else the recipe's ([recipe] die in its recipe.toml), else an A2."""
    if name:
        key = name.upper()
        if key not in DIES:
            raise ValueError(f"no die {name!r}; known: {', '.join(DIES)}")
        return DIES[key]
    recipe = settings.get("_recipe")
    return DIES[(manifest.recipe_die(str(recipe)) if recipe else None) or "A2"]


def plan_launch(settings: Mapping[str, Any], die: str | None = None, model: str | None = None, **kw) -> Plan:
    """Plan a launch's settings: its model's config (or the shipped table), its die."""
    cfg, source = model_config(settings.get("actor_rollout_ref.model.path"), model)
    p = plan(settings, cfg, die_for(settings, die), **kw)
    p.facts.insert(0, ("model config", source))
    return p


def short_plan_lines(p: Plan) -> list[str]:
    """The dry run's lines: each phase's total, the peak marked."""
    peak = p.peak
    out = []
    for ph in p.phases:
        mark = "  <- peak" if ph is peak else ""
        label = ph.name if ph.kind == "phase" else f"-> {ph.name}"
        out.append(f"{label:<26} {ph.total / GIB:7.2f} GiB  (largest: {ph.largest().name}){mark}")
    return out


def measured_terms(p: Plan, rank: int | None = None) -> dict[str, int]:
    """The plan's exact terms a CPU run's hook measures (hooks/recipes_memory_record.py), by the record's names:
    the actor's weights, gradients and optimizer states in the update (those of training rank `rank` where the plan
    has them per rank), the rollout's weights, and the KV cache's bytes per block token (the KV cache's size on CPU
    is VLLM_CPU_KVCACHE_SPACE's, not vLLM-Ascend's rule)."""
    update = {t.name: t.nbytes for t in next(ph for ph in p.phases if ph.name == "actor update").terms}
    gen = {t.name: t for t in next(ph for ph in p.phases if ph.name == "generation").terms}
    out = {
        "weights": update["actor weights"],
        "gradients": update["actor gradients"],
        "optimizer_states": update["optimizer states"],
        "rollout_weights": gen["rollout weights"].nbytes,
        "kv_cache_per_token": p.kv_bytes_per_token,
    }
    if rank is not None and p.rank_terms:
        out.update(p.rank_terms[rank])
    return out
