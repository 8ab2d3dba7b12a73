"""A test script run against a patched verl tree in a subprocess, and the pieces its subprocess side shares.

The tree goes first on PYTHONPATH so it never mixes with the unpatched verl installed in the venv; the
script prints its measurements as JSON on its last line, which run_on_tree returns.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path


def patched_copy(pristine: Path, dest: Path, series) -> Path:
    """A copy of the pristine verl tree at dest with series (an overlay.Recipe) applied."""
    from ascend_rl import overlay

    shutil.copytree(pristine, dest, symlinks=True)
    overlay.apply_series(series, dest)
    return dest


def run_on_tree(script: str | Path, tree: Path, timeout: int = 900) -> dict:
    """Run `python script --tree tree` with the tree on PYTHONPATH and no GPU; its last line's JSON."""
    # the tree first; then this folder, where the test (now a script) finds its helpers
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parent)]),
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [sys.executable, str(script), "--tree", str(tree)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_qwen2(seed: int):
    """A random two-layer Qwen2 with a 64-token vocabulary, eager attention, in fp32."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(cfg)


def ppo_batch(old_log_probs=None, batch: int = 4, prompt_len: int = 6, response_len: int = 5, micro: int = 2):
    """A seeded PPO update batch of random tokens: one left-padded prompt, one response that ended early."""
    import torch
    from verl import DataProto

    g = torch.Generator().manual_seed(1)
    seq = prompt_len + response_len
    input_ids = torch.randint(1, 64, (batch, seq), generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[0, :2] = 0  # left-padded prompt
    attention_mask[1, -2:] = 0  # response ended early
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt_len:],
        "response_mask": attention_mask[:, prompt_len:],
        "advantages": torch.randn(batch, response_len, generator=g),
    }
    if old_log_probs is not None:
        tensors["old_log_probs"] = old_log_probs
    meta = {"temperature": 1.0, "micro_batch_size": micro, "use_dynamic_bsz": False}
    return DataProto.from_dict(tensors=tensors, meta_info=meta)
