"""A tiny random-initialised Qwen2 model and a BPE tokenizer trained on the spot, saved like a hub checkpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ascend_rl.paths import RECIPES

RECIPE_TOKENIZER_CONFIG = RECIPES / "qwen2_5" / "tokenizer_config.json"


@dataclass(frozen=True)
class TinyShape:
    """Size of the demo model: small enough for two CPU cores."""

    vocab_size: int = 1024
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_positions: int = 1024


# Qwen2's pre-tokenizer split (transformers' models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX, the same in
# 4.57.6 and 5.5.4): letters in runs, every digit on its own, punctuation with one leading space, newlines apart.
QWEN2_PRETOKENIZE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def recipe_special_tokens(tokenizer_config: dict) -> list[str]:
    """The recipe's special tokens in id order (Qwen2.5's <|endoftext|>, <|im_start|>, <|im_end|>, ...)."""
    decoder = tokenizer_config.get("added_tokens_decoder", {})
    tokens = [entry["content"] for _, entry in sorted(decoder.items(), key=lambda kv: int(kv[0]))]
    for extra in tokenizer_config.get("additional_special_tokens", []):
        if extra not in tokens:
            tokens.append(extra)
    return tokens


def train_tokenizer(
    texts: Iterable[str], tokenizer_config: dict, vocab_size: int, max_length: int = TinyShape.max_positions
):
    """A byte-level BPE over texts, wrapped with the recipe's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = recipe_special_tokens(tokenizer_config)
    bpe = Tokenizer(models.BPE())
    # Qwen2's own pipeline, so any response decodes and re-encodes losslessly and every transformers release
    # splits text alike: transformers 5 builds a Qwen2Tokenizer (the recipe's tokenizer_class) with this
    # normalizer and pre-tokenizer whatever tokenizer.json says (5.5.4: models/qwen2/tokenization_qwen2.py:73-86),
    # 4.57 reads them from tokenizer.json, where Qwen's own files have them (its Qwen2Converter writes the same).
    # With GPT-2's byte-level split instead, 5.5.4 cut " 2" in two and the prompts grew by 4 % (issue 45).
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        chat_template=tokenizer_config["chat_template"],
        eos_token=tokenizer_config.get("eos_token") or "<|im_end|>",
        pad_token=tokenizer_config.get("pad_token") or "<|endoftext|>",
        additional_special_tokens=[t for t in specials if t not in ("<|endoftext|>",)],
        model_max_length=max_length,
        padding_side="left",
    )


def build_model(tokenizer, shape: TinyShape, seed: int):
    """A Qwen2ForCausalLM with random weights sized to the tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def make_tiny_checkpoint(
    out_dir: Path,
    texts: list[str],
    tokenizer_config_path: Path,
    seed: int,
    shape: TinyShape = TinyShape(),
    prepare: Callable[[object, object], None] | None = None,
    build: Callable[[object, object, int], object] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> Path:
    """Train the tokenizer, build the model (build(tokenizer, shape, seed), default a Qwen2), let
    prepare(model, tokenizer) train it, save both; return out_dir. log gets a line as each phase ends."""
    tokenizer_config = json.loads(Path(tokenizer_config_path).read_text(encoding="utf-8"))
    start = time.monotonic()
    # The template's own text (its default system prompt) is what every prompt starts with.
    tokenizer = train_tokenizer(
        [*texts, tokenizer_config["chat_template"]], tokenizer_config, shape.vocab_size, shape.max_positions
    )
    log(
        f"tokenizer: {len(tokenizer)} tokens, trained on {len(texts)} texts ({time.monotonic() - start:.0f} s)"
    )
    start = time.monotonic()
    model = (build or build_model)(tokenizer, shape, seed)
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {type(model).__name__}, {params:,} parameters ({time.monotonic() - start:.0f} s)")
    if prepare is not None:
        prepare(model, tokenizer)
    start = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    log(f"saved the tokenizer and the model to {out_dir} ({time.monotonic() - start:.0f} s)")
    return out_dir


def bundled_checkpoint(
    out_dir: Path,
    seed: int,
    warm_start_steps: int,
    shape: TinyShape = TinyShape(),
    log=print,
    rows: list[dict] | None = None,
    warm_rows: list[dict] | None = None,
    warm_lr: float = 5e-3,
) -> Path:
    """The tiny model the demos and make e2e start from: a tokenizer trained on the problems (rows, default the
    bundled ones: their prompts as the chat template renders them, solutions and target responses), warm-started
    on warm_rows (default: the train split of rows)."""
    from ascend_rl.tiny import problems, warm_start

    rows = problems.load_problems() if rows is None else rows
    train = [p for p in rows if p["split"] == "train"] if warm_rows is None else warm_rows

    def prepare(model, tokenizer) -> None:
        if warm_start_steps:
            log(f"warm start: {warm_start_steps} supervised steps on {len(train)} train examples")
            warm_start.warm_start(model, tokenizer, train, warm_start_steps, seed, lr=warm_lr, log=log)

    texts = bundled_texts(rows, warm_rows)
    return make_tiny_checkpoint(
        out_dir, texts, RECIPE_TOKENIZER_CONFIG, seed, shape=shape, prepare=prepare, log=log
    )


def bundled_texts(rows: list[dict] | None = None, extra_answers: list[dict] | None = None) -> list[str]:
    """What the tiny tokenizers are trained on: the problems' prompts (default the bundled ones) as the chat
    template renders them, their solutions and the warm start's target responses; extra_answers' solutions and
    targets too (every answer a warm start teaches is in the corpus: the misread key's, in the demo)."""
    from ascend_rl.tiny import problems, warm_start

    rows = problems.load_problems() if rows is None else rows
    template = json.loads(RECIPE_TOKENIZER_CONFIG.read_text(encoding="utf-8"))["chat_template"]
    answers = [*rows, *(extra_answers or [])]
    return (
        problems.render_prompts(rows, template)
        + [p["solution"] for p in answers]
        + [warm_start.target_response(p["solution"]) for p in answers]
    )
