"""A tiny random-initialised DeepSeek-V3 (MLA attention, routed + shared experts), saved like a hub checkpoint.

Same architecture as the recipe's model (transformers' DeepseekV3ForCausalLM, vLLM's DeepseekV3ForCausalLM), at a
size two CPU cores load in seconds. Facts it is built around (vLLM 0.13.0's CPU build):
- CPU attention takes head sizes 32, 64, ... 256: with VLLM_MLA_DISABLE=1 (the CPU platform refuses MLA) the
  attention runs unabsorbed with q/k heads of nope + rope = 64 and v heads of 32;
- transformers' DeepseekV3Config does not write the router's topk_method / scoring_func, which vLLM reads; the real
  V3 config has "noaux_tc" / "sigmoid" (and an e_score_correction_bias that vLLM loads only for noaux_tc);
- one routed-expert group (n_group = topk_group = 1), so grouped top-k is plain top-k over 8 experts.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ascend_rl.tiny import qwen2

# What DeepSeek-V3's own config.json says about its router and transformers' config class leaves out.
ROUTER_CONFIG = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
# DeepSeek's end-of-sentence token, which the real V3 / R1 tokenizers have and verl 0.9.1's agent loop requires of a
# deepseek_v3 model's tokenizer: its DeepSeek continuous-token builder refuses one without it
# (verl/utils/tokenizer/continuous_token.py:970 require_token_id(tokenizer, self._EOS_TOKEN)). The 0.9.1 runs' tiny
# model adds it as a special token (make_checkpoint's special_tokens); the 0.6.0 / 0.7.1 checkpoint stays as it was.
DEEPSEEK_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"


@dataclass(frozen=True)
class DeepSeekShape:
    """Two layers: the first dense (first_k_dense_replace), the second MoE with 8 routed experts (top-2) and 1 shared."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    first_k_dense: int = 1
    num_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 32
    v_head_dim: int = 32
    intermediate_size: int = 256
    moe_intermediate_size: int = 64
    n_routed_experts: int = 8
    experts_per_tok: int = 2
    n_shared_experts: int = 1
    # the DeepSeek recipe's max_model_len is 1024 + 3072
    max_positions: int = 4096


def random_router_bias() -> bool:
    """Whether build_model draws the router's e_score_correction_bias: under transformers 5 (the verl 0.9.1 stack),
    not under 4.x. transformers holds the bias as a buffer (DeepseekV3TopkRouter's register_buffer, in 4.57.6 as in
    5.5.4), which the maker's loop over named_parameters() never reached, so every checkpoint made under 4.57.6
    (the 0.6.0 / 0.7.1 runs) has a zero bias; drawing it there would change those checkpoints and their runs'
    figures, so 4.x keeps it at zero (tests/harness/test_megatron_engine_091.py holds the 4.57.6 checkpoint's bytes)."""
    import transformers

    return int(transformers.__version__.split(".", 1)[0]) >= 5


def build_model(tokenizer, shape: DeepSeekShape, seed: int):
    """A DeepseekV3ForCausalLM with random weights sized to the tokenizer; under transformers 5 the router bias is
    random too (HF starts it at zero), so a weight sync that drops it changes the routing (random_router_bias)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        moe_intermediate_size=shape.moe_intermediate_size,
        num_hidden_layers=shape.num_layers,
        first_k_dense_replace=shape.first_k_dense,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        q_lora_rank=shape.q_lora_rank,
        kv_lora_rank=shape.kv_lora_rank,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        v_head_dim=shape.v_head_dim,
        n_routed_experts=shape.n_routed_experts,
        num_experts_per_tok=shape.experts_per_tok,
        n_shared_experts=shape.n_shared_experts,
        n_group=1,
        topk_group=1,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        **ROUTER_CONFIG,
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    if random_router_bias():
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.normal_(0.0, 0.1)
    return model


def make_checkpoint(
    out_dir: Path,
    seed: int = 1,
    shape: DeepSeekShape = DeepSeekShape(),
    texts: list[str] | None = None,
    tokenizer_config_path: Path = qwen2.RECIPE_TOKENIZER_CONFIG,
    prepare: Callable[[object, object], None] | None = None,
    special_tokens: tuple[str, ...] = (),
) -> Path:
    """Tokenizer (trained on texts, default the bundled problems, with the chat template of tokenizer_config_path,
    and special_tokens added to its special tokens), model, prepare(model, tokenizer) if given, saved to out_dir
    with the router keys in config.json."""
    with tempfile.TemporaryDirectory(prefix="tiny-deepseek-") as tmp:
        if special_tokens:
            config = json.loads(Path(tokenizer_config_path).read_text(encoding="utf-8"))
            extra = config.get("additional_special_tokens", [])
            config["additional_special_tokens"] = extra + [t for t in special_tokens if t not in extra]
            tokenizer_config_path = Path(tmp) / "tokenizer_config.json"
            tokenizer_config_path.write_text(json.dumps(config), encoding="utf-8")
        qwen2.make_tiny_checkpoint(
            out_dir,
            qwen2.bundled_texts() if texts is None else texts,
            tokenizer_config_path,
            seed,
            shape=shape,
            prepare=prepare,
            build=build_model,
        )
    config_path = Path(out_dir) / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    missing = {k: v for k, v in ROUTER_CONFIG.items() if config.get(k) != v}
    if missing:  # transformers dropped them on save: write them as the real V3 config has them
        config.update(missing)
        config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return Path(out_dir)
