"""The recipe's tokenizer config and chat template under verl 0.9.1's pinned transformers (5.5.4), as under 4.57.6.

The same script runs in this environment (transformers 4.57.6, what the 0.6.0 / 0.7.1 stacks pin) and in verl 0.9.1's
e2e environment (.venv-e2e-091: transformers 5.5.4, constraints-0.9.1.txt): it installs llm_rl/qwen2_5/
tokenizer_config.json into a model folder with the recipe's own command (`python3 -m ascend_rl tokenizer_config`),
loads the folder with AutoTokenizer and renders and encodes the conversations the chat-template tests use. The
prompts, their token ids and the special tokens must be the same under both releases. So must the ids of the tiny
Qwen2 tokenizer the CPU runs train (ascend_rl/tiny/qwen2.py): transformers 5 builds a Qwen2Tokenizer with Qwen2's own
pre-tokenizer whatever tokenizer.json says, which once cut the demo's prompts differently under 5.5.4. Full tier: it
needs the 0.9.1 environment (the e2e_python_091 fixture builds it once per machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl.paths import child_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.full]

DRIVER = r"""
import json, sys
from pathlib import Path
import transformers
from transformers import AutoTokenizer
from tiny_tokenizer import build_tokenizer_dir
from ascend_rl.cli import tokenizer_config as itc_cli
from ascend_rl.data.util import run_cli

model = Path(sys.argv[1]) / "Qwen2_5_1_5B_Instruct"
build_tokenizer_dir(model)
(model / "config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
original = model / "tokenizer_config.json"
original.write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer", "chat_template": "original"}), encoding="utf-8")
assert run_cli(itc_cli.main, [str(model)]) == 0
tok = AutoTokenizer.from_pretrained(str(model))
conversations = [
    [{"role": "user", "content": "What is $1+1$?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Let $a = 3$. What is $a$?"}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>\nStep 1: y\n</think>"},
     {"role": "user", "content": "z"}],
]
out = {"transformers": transformers.__version__, "renders": [], "ids": []}
for messages in conversations:
    for prompt in (True, False):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        out["renders"].append(text)
        out["ids"].append(tok(text, add_special_tokens=False)["input_ids"])
out["special"] = {t: tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")}
out["eos"], out["pad"] = tok.eos_token, tok.pad_token
print(json.dumps(out))
"""


ENCODE = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.loads(sys.argv[2])
print(json.dumps([tok(t, add_special_tokens=False)["input_ids"] for t in texts]))
"""


def _render(python: Path, tmp: Path) -> dict:
    tmp.mkdir()
    proc = subprocess.run(
        [str(python), "-c", DRIVER, str(tmp)],
        cwd=REPO,
        # the tests folder for tiny_tokenizer, as pytest's rootdir conftest has it here
        env=child_env({**os.environ, "PYTHONPATH": str(REPO / "tests")}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_chat_template_renders_and_encodes_the_same_under_transformers_5(e2e_python_091, tmp_path):
    here = _render(Path(sys.executable), tmp_path / "here")
    there = _render(e2e_python_091, tmp_path / "v091")
    assert there["transformers"] == "5.5.4", there["transformers"]
    assert here["transformers"].startswith("4."), here["transformers"]
    # the recipe's format prompt reaches the model under both
    assert "<answer>" in there["renders"][0] and there["renders"][0].endswith("<|im_start|>assistant\n")
    assert there["special"] == {"<|im_start|>": 151644, "<|im_end|>": 151645, "<|endoftext|>": 151643}
    for key in ("renders", "ids", "special", "eos", "pad"):
        assert there[key] == here[key], (key, here[key], there[key])


def test_the_tiny_qwen2_tokenizer_encodes_the_same_under_transformers_5(e2e_python_091, tmp_path):
    """The tiny tokenizer the e2e runs and the demo train, over the demo's prompts rendered by the recipe's
    template: the same ids under both releases (with GPT-2's byte-level split, 5.5.4 gave 196 ids to a 189-id
    prompt and verl 0.9.1 filtered every demo prompt as too long)."""
    from ascend_rl.harness import lookup
    from ascend_rl.tiny import qwen2

    config = json.loads((REPO / "llm_rl" / "qwen2_5" / "tokenizer_config.json").read_text(encoding="utf-8"))
    rows = lookup.generate(64)
    tokenizer = qwen2.train_tokenizer(qwen2.bundled_texts(rows), config, 620)
    tokenizer.save_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": r["problem"]}], tokenize=False)
        for r in rows[:40]
    ] + ["x = 12,345.6 and 2024年 \\boxed{-3}\n\n  <answer>"]
    ids = {}
    for name, python in (("here", Path(sys.executable)), ("v091", e2e_python_091)):
        proc = subprocess.run(
            [str(python), "-c", ENCODE, str(tmp_path / "tok"), json.dumps(texts)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        ids[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ids["here"] == ids["v091"]
    assert all(len(i) > 20 for i in ids["here"][:-1])  # whole prompts, not empty encodings
