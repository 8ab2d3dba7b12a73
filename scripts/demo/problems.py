"""The bundled MATH-style problems: written out as a MATH-lighteval parquet folder, then run through prepare_math."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "llm_rl" / "qwen2_5" / "demo" / "problems.jsonl"
COLUMNS = ("problem", "level", "type", "solution")


def load_problems(path: Path = BUNDLED) -> list[dict]:
    """The bundled problems, one dict per JSONL line (MATH-lighteval columns plus split)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_lighteval_dir(problems: list[dict], raw_dir: Path) -> Path:
    """Write the problems as data/{train,test}-00000-of-00001.parquet, the layout of the hub download."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = raw_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = [p for p in problems if p["split"] == split]
        table = pa.table({c: [r[c] for r in rows] for c in COLUMNS})
        pq.write_table(table, data_dir / f"{split}-00000-of-00001.parquet")
    return raw_dir


def prepare(out_dir: Path, log=print) -> dict[str, Path]:
    """Bundled problems -> raw parquet -> prepare_math.convert -> {split: verl parquet path}."""
    import prepare_math

    raw = write_lighteval_dir(load_problems(), out_dir / "raw")
    stats = prepare_math.convert(raw, out_dir, log=log)
    return dict(stats.outputs)


def render_prompts(problems: list[dict], chat_template: str) -> list[str]:
    """Each problem as the chat template renders it, for training the demo tokenizer."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(chat_template)
    return [
        template.render(messages=[{"role": "user", "content": p["problem"]}], add_generation_prompt=True)
        for p in problems
    ]
