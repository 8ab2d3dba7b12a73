"""The shape check of an FSDP2 launch on verl 0.9.1 (shape_check.run hands it over): every rank of the world (up to
8; the first and the last beyond, the only shard sizes there are) built as verl 0.9.1's FSDP engine shards the model
(ascend_rl/harness/fake_fsdp.py: verl's own apply_fsdp2 on the Hugging Face model built on the meta device, with
the fake process group), and each rank's weight, gradient and optimizer bytes compared with the memory plan's
(memory_plan._fsdp_state's rank_terms, from fsdp2_shards): weights and gradients the stored shard (padded to the
first rank's rows) at the model dtype, AdamW's m and v the unpadded local shard at the model dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ascend_rl import manifest
from ascend_rl import memory_plan as mp
from ascend_rl.harness.shape_check import (
    HERE,
    ShapeCheckError,
    Target,
    build_inputs,
    disagree,
    run_builder,
)
from ascend_rl.paths import REPO

F = "actor_rollout_ref.actor.fsdp_config."
FIELDS = ("weights", "gradients", "optimizer_states")


def fsdp_ranks(world: int) -> list[int]:
    """The ranks to build: every rank up to a world of 8; beyond, the first and the last (torch.chunk's rule gives
    every rank but the tail ones the first rank's rows, and the tail's sizes are the last rank's or zero)."""
    return list(range(world)) if world <= 8 else [0, world - 1]


def fsdp_spec(t: Target, model_dir: Path, ranks: list[int], jobs: int) -> dict:
    s = t.settings
    return {
        "model_dir": str(model_dir),
        "world": int(s["trainer.nnodes"]) * int(s["trainer.n_gpus_per_node"]),
        "fsdp_size": int(s.get(F + "fsdp_size") or -1),
        "model_dtype": s.get(F + "model_dtype") or "fp32",
        "reshard_after_forward": bool(s.get(F + "reshard_after_forward", True)),
        "wrap_policy": dict(s.get(F + "wrap_policy") or {}),
        "ranks": ranks,
        "jobs": jobs,
    }


def build(t: Target, ranks: list[int], jobs: int, use_cache: bool, log=print) -> dict:
    """fake_fsdp.py's result for `ranks` (cached by the spec and the builder's and verl's FSDP sources)."""
    from ascend_rl.harness.launch import HarnessError, base_python

    try:
        python = base_python(t.base)
    except HarnessError as exc:
        raise ShapeCheckError(str(exc)) from None
    root, model_dir, tree = build_inputs(t)
    spec = fsdp_spec(t, model_dir, ranks, jobs)
    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode() + str(python.resolve()).encode())
    for path in (
        HERE / "fake_fsdp.py",
        tree / "verl" / "utils" / "fsdp_utils.py",
        tree / "verl" / "workers" / "engine" / "fsdp" / "utils.py",
    ):
        h.update(path.read_bytes() if path.is_file() else b"-")
    cached = root / f"build-fsdp-{h.hexdigest()[:16]}.json"
    if use_cache and cached.is_file():
        log(f"shape_check: the build of these ranks is cached ({cached.name}; --no-cache builds again)")
        return json.loads(cached.read_text())
    env = dict(os.environ)
    env.update(dict(manifest.resolve_launch(t.recipe, t.base, profile="cpu").cpu_env or ()))
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(REPO)])
    env.setdefault("OMP_NUM_THREADS", "1")
    log(f"shape_check: building {len(ranks)} ranks of verl {t.base}'s FSDP2 actor ({jobs} at a time)")
    return run_builder(python, "ascend_rl.harness.fake_fsdp", spec, env, cached)


def built_figures(row: dict) -> dict[str, int]:
    """A built rank's bytes as memory_plan._fsdp_state counts them: the stored (padded) shard for the weights and
    the gradients (FSDP2's sharded gradient takes the parameter's dtype), AdamW's m and v of the unpadded local
    shard (torch.zeros_like of the DTensor's local tensor) at the parameter's dtype."""
    size = int(row["element_size"])
    return {
        "weights": int(row["stored"]) * size,
        "gradients": int(row["stored"]) * size,
        "optimizer_states": 2 * size * int(row["local"]),
    }


def planned_figures(t: Target) -> dict[int, dict[str, int]]:
    """The memory plan's per-rank figures (memory_plan._fsdp_state's rank_terms) of the launch on an NPU die."""
    s = dict(t.settings, **{"trainer.device": "npu"})
    return dict(mp.plan_launch(s).rank_terms)


def compare(built: dict[int, dict[str, int]], planned: dict[int, dict[str, int]]) -> list[str]:
    lines = []
    for rank in sorted(built):
        p = planned.get(rank)
        if p is None:
            lines.append(f"rank {rank}: built, not planned")
            continue
        for field in FIELDS:
            if built[rank][field] != p[field]:
                lines.append(f"rank {rank} {field}: built {built[rank][field]:,} != planned {p[field]:,}")
    return lines


def run(t: Target, jobs: int, use_cache: bool, log=print) -> tuple[int, dict]:
    """Check the FSDP2 launch `t`: (exit status, report)."""
    s = t.settings
    world = int(s["trainer.nnodes"]) * int(s["trainer.n_gpus_per_node"])
    fsdp_size = int(s.get(F + "fsdp_size") or -1)
    if 0 < fsdp_size < world:
        raise ShapeCheckError(
            f"fsdp_size {fsdp_size} < world {world} (hybrid sharding) is not built; memory_plan plans the full world"
        )
    ranks = fsdp_ranks(world)
    result = build(t, ranks, jobs, use_cache, log)
    report: dict = {"base": t.base, "recipe": t.recipe, "strategy": "fsdp2", "build": result}
    errors = [r for r in result["ranks"] if "error" in r]
    if errors:
        first = errors[0]
        log(
            f"shape_check: the FSDP2 build failed on rank {first['rank']}: {first['error']} ({first.get('where')})"
        )
        report["refused"] = first["error"]
        return 1, report
    built = {int(r["rank"]): built_figures(r) for r in result["ranks"]}
    planned = planned_figures(t)
    unit = 2**30
    log(
        f"shape_check: {len(built)} FSDP2 ranks of a world of {world} built by verl {t.base}'s apply_fsdp2 in "
        f"{result.get('wall_s', 0)} s (imports {result.get('imports_s')} s, torch {result.get('torch')})"
    )
    log(f"{'rank':>5}{'stored (M)':>12}{'local (M)':>11}{'weights':>10}{'grads':>9}{'optimizer':>11}   (GiB)")
    for r in sorted(result["ranks"], key=lambda r: r["rank"]):
        b = built[int(r["rank"])]
        log(
            f"{r['rank']:>5}{r['stored'] / 1e6:>12.1f}{r['local'] / 1e6:>11.1f}{b['weights'] / unit:>10.2f}"
            f"{b['gradients'] / unit:>9.2f}{b['optimizer_states'] / unit:>11.2f}"
        )
    if disagree(compare(built, planned), report, log):
        return 1, report
    log("shape_check: every FSDP2 rank built; its weights, gradients and optimizer bytes equal the plan's")
    return 0, report
