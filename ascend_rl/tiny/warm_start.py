"""The demo's initial policy: a short supervised pass on the train problems, in the recipe's answer format.

The real recipe starts GRPO from an instruction-tuned checkpoint that already answers in roughly the right
shape; a random model never would, so every reward would be 0 and every GRPO advantage with it. This pass
plays the role of that SFT checkpoint (plain PyTorch, cross-entropy on the response tokens only).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator

_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")

# The warm start's ops are small (16 x 241 tokens through a hidden-128 model): a second thread buys little on an
# idle machine and costs much on a busy one, where every op waits at a barrier for the thread the scheduler put
# aside. On 2 shared AVX2 cores (2026-12-07, scripts/probes/warm_start_threads.py) a step took 0.3 s of CPU and
# 0.7-1.1 s of wall on one thread against 1.5 s and 4.7-10.7 s on two, with losses and weights bit-identical
# (tests/harness/test_warm_start.py); one thread also computes alike on machines with more cores.
THREADS = 1


def target_response(solution: str) -> str:
    """A solution with one sentence per step, rewritten as <think> numbered steps </think><answer> \\boxed{} </answer>."""
    from ascend_rl.data.util import last_boxed

    answer = last_boxed(solution)
    if answer is None:
        raise ValueError(f"solution has no \\boxed{{}} answer: {solution[:80]!r}")
    sentences = [_BOXED.sub(r"\1", s).replace("$", "") for s in _SENTENCE_END.split(solution.strip())]
    steps = "\n".join(f"Step {i}: {s}" for i, s in enumerate(sentences, 1))
    return f"<think>\n{steps}\n</think>\n<answer>\n\\boxed{{{answer}}}\n</answer>"


def prompt_text(problem: str, tokenizer) -> str:
    """The prompt exactly as prepare_math.py writes it and verl's RLHFDataset renders it."""
    from ascend_rl.data.util import build_messages

    return tokenizer.apply_chat_template(build_messages(problem), add_generation_prompt=True, tokenize=False)


def _encode(problems: list[dict], tokenizer):
    """(input_ids, attention_mask, labels) right-padded; labels are -100 outside the response and its <|im_end|>."""
    import torch

    seqs, masks = [], []
    for p in problems:
        prompt = tokenizer(prompt_text(p["problem"], tokenizer), add_special_tokens=False)["input_ids"]
        response = tokenizer(target_response(p["solution"]) + tokenizer.eos_token, add_special_tokens=False)[
            "input_ids"
        ]
        seqs.append(prompt + response)
        masks.append([0] * len(prompt) + [1] * len(response))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, (seq, mask) in enumerate(zip(seqs, masks, strict=True)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        labels[row, : len(seq)] = torch.where(torch.tensor(mask).bool(), torch.tensor(seq), -100)
    return ids, attention, labels


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to n for the block, then put back."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _response_loss(model, ids, attention, labels):
    """Mean next-token cross-entropy over the response tokens; the LM head runs on those positions only."""
    import torch.nn.functional as F

    hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
    # Position t predicts token t + 1; most positions are prompt, which the loss ignores anyway.
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), targets[keep])


def warm_start(
    model,
    tokenizer,
    problems: list[dict],
    steps: int,
    seed: int,
    lr: float = 5e-3,
    batch_size: int = 16,
    log: Callable[[str], None] = print,
    threads: int = THREADS,
) -> list[float]:
    """Train model in place for `steps` AdamW steps (linear decay) on the problems, on `threads` torch threads;
    return the loss per step."""
    with _torch_threads(threads):
        return _train(model, tokenizer, problems, steps, seed, lr, batch_size, log)


def _train(model, tokenizer, problems, steps, seed, lr, batch_size, log) -> list[float]:
    import torch

    ids, attention, labels = _encode(problems, tokenizer)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / steps)
    model.train()
    losses: list[float] = []
    order = torch.empty(0, dtype=torch.long)
    # a line at least every 20th of the steps and every 15 s, with the time spent and the time left: on two busy
    # cores 120 steps took about 5 minutes, silent
    report_every = max(1, steps // 20)
    start = last_line = time.monotonic()
    since = 0
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order = torch.cat([order, torch.randperm(len(ids), generator=generator)])
        pick, order = order[:batch_size], order[batch_size:]
        width = int(attention[pick].sum(-1).max())
        loss = _response_loss(model, ids[pick, :width], attention[pick, :width], labels[pick, :width])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        since += 1
        now = time.monotonic()
        if step % report_every == 0 or step == steps or now - last_line >= 15:
            recent = losses[-since:]
            spent = now - start
            left = spent / step * (steps - step)
            log(
                f"warm start step {step}/{steps}: response cross-entropy {sum(recent) / len(recent):.3f} "
                f"({spent:.0f} s so far, about {left:.0f} s to go)"
            )
            last_line, since = now, 0
    model.eval()
    return losses
