"""The tiny model's warm start (ascend_rl/tiny/warm_start.py), the longest part of a first `make demo`'s set-up.

It runs on one torch thread (two cost five times the CPU and six to ten times the wall time on two busy AVX2 cores);
that is only safe because one thread trains the model bit for bit as two do, which the real tiny Qwen2 shows here.
Every phase of the set-up says how far it is.
"""

from __future__ import annotations

import re

import pytest

from ascend_rl.harness import lookup
from ascend_rl.harness.inputs import MODEL_SHAPE
from ascend_rl.tiny import problems, warm_start
from ascend_rl.tiny import qwen2 as tiny_qwen2

torch = pytest.importorskip("torch")


def test_the_warm_start_computes_on_one_thread_and_gives_the_callers_back(monkeypatch):
    seen: list[int] = []

    def loss(model, ids, attention, labels):
        seen.append(torch.get_num_threads())
        return (model.weight**2).sum()

    rows = torch.zeros(4, 3, dtype=torch.long)
    monkeypatch.setattr(
        warm_start, "_encode", lambda problems, tokenizer: (rows, torch.ones_like(rows), rows)
    )
    monkeypatch.setattr(warm_start, "_response_loss", loss)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        warm_start.warm_start(
            torch.nn.Linear(2, 1), None, [], steps=3, seed=0, batch_size=2, log=lambda m: None
        )
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo_inputs():
    """The demo's own tokenizer, initial model (its shape and seed) and misread answer key."""
    from ascend_rl.harness import demo

    return demo.warm_start_inputs(seed=2)


def test_one_thread_trains_the_demo_model_bit_for_bit_as_two_do(demo_inputs):
    import copy

    tokenizer, model, key = demo_inputs
    runs = {}
    for threads in (2, 1):
        trained = copy.deepcopy(model)
        losses = warm_start.warm_start(
            trained, tokenizer, key, steps=6, seed=2, lr=3e-3, log=lambda m: None, threads=threads
        )
        runs[threads] = losses, trained.state_dict()
    (losses2, weights2), (losses1, weights1) = runs[2], runs[1]
    assert losses1 == losses2 and losses1[-1] < losses1[0]
    assert all(torch.equal(weights1[name], weights2[name]) for name in weights2)


def test_every_phase_of_the_set_up_says_how_far_it_is(tmp_path):
    rows = lookup.generate(64)
    lines: list[str] = []
    problems.prepare(tmp_path / "data", log=lambda m: None, rows=rows, summary=lines.append)
    tiny_qwen2.bundled_checkpoint(
        tmp_path / "model",
        seed=2,
        warm_start_steps=2,
        shape=tiny_qwen2.TinyShape(**MODEL_SHAPE),
        log=lines.append,
        rows=rows,
        warm_rows=[r for r in rows if r["split"] == "train"][:32],
    )
    expected = [
        r"data: 836 train, 64 test problems -> .*/data \(\d+ s\)",
        r"tokenizer: \d+ tokens, trained on \d+ texts \(\d+ s\)",
        r"model: Qwen2ForCausalLM, [\d,]+ parameters \(\d+ s\)",
        r"warm start: 2 supervised steps on 32 train examples",
        r"warm start step 1/2: response cross-entropy [\d.]+ \(\d+ s so far, about \d+ s to go\)",
        r"warm start step 2/2: response cross-entropy [\d.]+ \(\d+ s so far, about 0 s to go\)",
        r"saved the tokenizer and the model to .*/model \(\d+ s\)",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
