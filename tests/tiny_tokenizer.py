"""A tiny byte-level tokenizer carrying the Qwen2.5 recipe's tokenizer_config.json, built offline.

Its model knows only the 256 byte symbols, so any text round-trips, and Qwen2.5's added tokens sit at their
real ids (151643-151664). Loading it with AutoTokenizer exercises the recipe file exactly as a download would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE_TOKENIZER_CONFIG = REPO / "llm_rl" / "qwen2_5" / "tokenizer_config.json"


def _byte_symbols() -> list[str]:
    # GPT-2's printable stand-ins for the 256 byte values, the alphabet of byte-level BPE.
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    extra = 0
    symbols = {}
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_tokenizer_dir(dest: Path, tokenizer_config: Path = RECIPE_TOKENIZER_CONFIG) -> Path:
    """Write tokenizer.json and a copy of tokenizer_config into dest; return dest."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    config = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(_byte_symbols())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    spec = json.loads(tok.to_str())
    # Added tokens keep their ids only if the model vocab already holds them; written into the JSON
    # directly because Tokenizer.save() warns about the id gap below 151643.
    spec["added_tokens"] = []
    for tid, entry in sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0])):
        spec["model"]["vocab"][entry["content"]] = int(tid)
        spec["added_tokens"].append(
            {
                "id": int(tid),
                "content": entry["content"],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": entry["special"],
            }
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    shutil.copy(tokenizer_config, dest / "tokenizer_config.json")
    return dest


def load_tokenizer(dest: Path):
    """Build the tiny tokenizer in dest and load it the way verl does (AutoTokenizer.from_pretrained)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(build_tokenizer_dir(dest)))
