"""Probe: the demo's warm start per step on two torch threads (the old default) and one (now), in one run (issue 61).

Builds the demo's tokenizer, initial model (its shape and seed) and misread answer key as `make demo` does, then
times `--steps` warm-start steps from the same initial weights on each thread count in turn, `--rounds` times
(A B A B ...: a machine whose speed drifts shows in both), and prints each count's median wall and CPU seconds
per step (CPU: this process's, all threads), the ratios and the 600-step projection, and whether every thread
count gave the same losses and weights bit for bit. Run it with the Python the demo runs in:

    PYTHONPATH=$PWD .venv-e2e/bin/python scripts/probes/warm_start_threads.py --steps 8 --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=8, help="warm-start steps per timing (default: %(default)s)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timings per thread count (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", default="2,1", help="thread counts, comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--full", type=int, default=600, help="steps to project to (default: make demo's 600)"
    )
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    if args.steps < 1 or args.rounds < 1 or not counts or min(counts) < 1:
        parser.error("--steps, --rounds and every thread count must be at least 1")

    import torch

    from ascend_rl.harness import demo
    from ascend_rl.tiny import warm_start

    tokenizer, model, key = demo.warm_start_inputs(seed=2)  # make demo's default seed

    wall: dict[int, list[float]] = {t: [] for t in counts}
    cpu: dict[int, list[float]] = {t: [] for t in counts}
    results: dict[int, tuple[list[float], dict]] = {}
    for _ in range(args.rounds):
        for threads in counts:
            trained = copy.deepcopy(model)
            w0, c0 = time.perf_counter(), time.process_time()
            losses = warm_start.warm_start(
                trained, tokenizer, key, args.steps, 2, lr=3e-3, log=lambda m: None, threads=threads
            )
            wall[threads].append((time.perf_counter() - w0) / args.steps)
            cpu[threads].append((time.process_time() - c0) / args.steps)
            results[threads] = losses, trained.state_dict()

    base = counts[0]
    print(
        f"warm start, {args.steps} steps x {args.rounds} rounds, torch {torch.__version__}, per step (median):"
    )
    for threads in counts:
        w, c = statistics.median(wall[threads]), statistics.median(cpu[threads])
        print(
            f"  {threads} thread(s): wall {w * 1000:.0f} ms, CPU {c * 1000:.0f} ms; "
            f"{args.full} steps about {w * args.full:.0f} s; "
            f"wall {statistics.median(wall[base]) / w:.2f}x, CPU {statistics.median(cpu[base]) / c:.2f}x "
            f"against {base} thread(s) (wall min-max {min(wall[threads]) * 1000:.0f}-{max(wall[threads]) * 1000:.0f} ms)"
        )
    losses0, weights0 = results[base]
    same = all(
        losses == losses0 and all(torch.equal(weights[name], weights0[name]) for name in weights0)
        for losses, weights in results.values()
    )
    print(f"losses and weights bit-identical across thread counts: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
