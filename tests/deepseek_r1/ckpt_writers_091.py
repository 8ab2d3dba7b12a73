"""A trainer rank in a Megatron checkpoint save on verl 0.9.1: the driver of test_ckpt_writers_091.py.

One gloo rank (world 1) in verl 0.9.1's e2e environment, on a verl tree made by the overlay (the DeepSeek 0.9.1
series and the CPU overlay, whose cpu-0017 the checkpoint manager's import brings in, as on every save), with
megatron-core 0.16 on PYTHONPATH. It saves a sharded state dict through verl's save_dist_checkpointing, as
MegatronCheckpointManager does:
- --mode sync: async_save off (the DeepSeek default): megatron-core runs the writers' parent in this process, which
  forks one writer per bucket (filesystem_async.py:266);
- --mode async: async_save on, the request scheduled on megatron-core's AsyncCallsQueue as the manager schedules it
  (async_calls.schedule_async_request): a TemporalAsyncCaller forked from this process (async_utils.py:216) forks
  the writers.
With --block, the shard files (`__0_<n>.distcp`) are made FIFOs first: each writer stays in open() until the test
kills this rank, the writers' parent waits for them, and the save never ends. Without it the save completes (async:
finalised, blocking) and is loaded back; the result, with this process's pid, goes to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SHARDS = 4


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", choices=("sync", "async"), required=True)
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=0, world_size=1)
    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.strategies.base import async_calls

    mpu.initialize_model_parallel()
    # what every save of MegatronEngine imports (on the CPU overlay, cpu-0017's CPU shims come with it)
    import verl.utils.checkpoint.megatron_checkpoint_manager  # noqa: F401
    from verl.utils.megatron import dist_checkpointing

    gen = torch.Generator().manual_seed(7)
    tensors = {f"layer{i}.weight": torch.randn(64, 32, generator=gen) for i in range(SHARDS)}

    def sharded() -> dict:
        return {k: ShardedTensor.from_rank_offsets(k, v.clone()) for k, v in tensors.items()}

    args.ckpt.mkdir(parents=True, exist_ok=True)
    if args.block:
        for n in range(SHARDS):
            os.mkfifo(args.ckpt / f"__0_{n}.distcp")
    report = {"pid": os.getpid(), "mode": args.mode, "installed": None}
    try:
        from verl.utils.megatron import writers_die_with_rank

        report["installed"] = writers_die_with_rank.installed()
    except ImportError:  # the tree without ds-0211
        report["installed"] = False
    args.out.write_text(json.dumps({**report, "saving": True}))
    request = dist_checkpointing.save_dist_checkpointing(
        sharded(), str(args.ckpt), async_save=args.mode == "async"
    )
    if args.mode == "async":
        async_calls.schedule_async_request(request)
        if args.block:  # the writers are blocked: wait here until the test kills this rank
            args.out.write_text(json.dumps({**report, "saving": True, "scheduled": True}))
            while True:
                os.pause()
        async_calls.maybe_finalize_async_calls(blocking=True)
    loaded = dist_checkpointing.load_dist_checkpointing(
        {k: ShardedTensor.from_rank_offsets(k, torch.zeros_like(v)) for k, v in tensors.items()},
        str(args.ckpt),
    )
    report["saved"] = sorted(p.name for p in args.ckpt.iterdir())
    report["equal"] = all(torch.equal(loaded[k], v) for k, v in tensors.items())
    args.out.write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
