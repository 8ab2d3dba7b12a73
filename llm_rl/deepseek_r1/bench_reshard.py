"""Benchmark of the train-to-rollout reshard: all-gather baseline vs planned AlltoAllV, per rank.

The DeepSeek-V3 figures are computed from the plan (nothing is allocated at that scale); a small
run over gloo on CPU processes then measures the same quantities and checks the results bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ascend_rl import moe_reshard as mr

GIB = 2**30


def gib(n: float) -> str:
    return f"{n / GIB:.4f}"


def pct(base: float, new: float) -> str:
    return f"{100 * (1 - new / base):.1f} %" if base else "-"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)

    def fmt(row: Sequence[str]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(cells))

    return "\n".join([title, fmt(header), line, *(fmt(r) for r in rows), ""])


# ----------------------------------------------------------------------------- modelled figures


def expert_rows(
    train: mr.TrainLayout, rollout: mr.RolloutLayout, model: mr.ModelSpec
) -> tuple[mr.ExpertPlan, list]:
    """Rows of the routed-expert table: one W1 step and the whole update, max over ranks."""
    plan = mr.plan_experts(train, rollout, model.num_experts)
    w1 = model.expert_params[0]
    ranks = range(train.world_size)
    stages = range(train.pp)
    base_step = [
        {
            k: sum(kw[k] for _, kw in mr.baseline_step_traffic(train, model.num_experts, r, s, w1.nbytes))
            for k in ("sent", "recv")
        }
        | {
            "extra": max(
                kw["extra"] for _, kw in mr.baseline_step_traffic(train, model.num_experts, r, s, w1.nbytes)
            )
        }
        for r in ranks
        for s in stages
    ]
    if plan.method == mr.ALLTOALLV:
        plan_step = [mr.expert_step_traffic(plan, r, s, w1.nbytes) for r in ranks for s in stages]
    else:
        plan_step = base_step
    base_tot = [mr.totals(mr.expert_traffic(plan, model, r, baseline=True)) for r in ranks]
    plan_tot = [mr.totals(mr.expert_traffic(plan, model, r)) for r in ranks]

    def row(label: str, b: float, p: float, as_bytes: bool = True) -> list[str]:
        return [label, gib(b) if as_bytes else str(int(b)), gib(p) if as_bytes else str(int(p)), pct(b, p)]

    mx = lambda seq, k: max(d[k] if isinstance(d, dict) else getattr(d, k) for d in seq)  # noqa: E731
    rows = [
        row(f"one {w1.name}, one layer: received (GiB)", mx(base_step, "recv"), mx(plan_step, "recv")),
        row(f"one {w1.name}, one layer: sent (GiB)", mx(base_step, "sent"), mx(plan_step, "sent")),
        row(f"one {w1.name}, one layer: peak extra (GiB)", mx(base_step, "extra"), mx(plan_step, "extra")),
        row(
            f"update ({len(model.moe_layers)} MoE layers x W1+W2): received (GiB)",
            mx(base_tot, "recv"),
            mx(plan_tot, "recv"),
        ),
        row("update: sent (GiB)", mx(base_tot, "sent"), mx(plan_tot, "sent")),
        row("update: collective calls", mx(base_tot, "calls"), mx(plan_tot, "calls"), as_bytes=False),
    ]
    return plan, rows


def dense_rows(
    train: mr.TrainLayout, params: Sequence[mr.DenseParam], num_layers: int, unit: int = 0
) -> list:
    """Rows of the TP-then-PP table, max over ranks; `unit` > 0 prints bytes in parameter units."""
    plan = mr.plan_dense(train, params, num_layers)
    ranks = range(train.world_size)
    base = [mr.dense_traffic(plan, r, baseline=True) for r in ranks]
    opt = [mr.dense_traffic(plan, r) for r in ranks]
    fmt = (lambda n: f"{n / unit:g}") if unit else gib

    def mx(meters: list[mr.Meter], step: str, key: str) -> int:
        return max(getattr(m.get(step, mr.Traffic()), key) for m in meters)

    def mx_sum(meters: list[mr.Meter], steps: Sequence[str], key: str) -> int:
        return max(sum(getattr(m.get(s, mr.Traffic()), key) for s in steps) for m in meters)

    b1, o1 = "dense/pp_broadcast", "dense/tp_allgather"
    o2 = ("dense/pp_alltoall", "dense/pp_broadcast")
    unit_name = "params" if unit else "GiB"
    return [
        [
            f"step 1 volume per card ({unit_name})",
            fmt(mx(base, b1, "buffer")),
            fmt(mx(opt, o1, "buffer")),
            pct(mx(base, b1, "buffer"), mx(opt, o1, "buffer")),
        ],
        [
            f"step 1 received from peers ({unit_name})",
            fmt(mx(base, b1, "recv")),
            fmt(mx(opt, o1, "recv")),
            pct(mx(base, b1, "recv"), mx(opt, o1, "recv")),
        ],
        [
            "TP all-gather calls",
            str(mx(base, o1, "calls")),
            str(mx(opt, o1, "calls")),
            pct(mx(base, o1, "calls"), mx(opt, o1, "calls")),
        ],
        [
            "PP calls (broadcast | AlltoAll)",
            str(mx(base, b1, "calls")),
            str(mx_sum(opt, o2, "calls")),
            pct(mx(base, b1, "calls"), mx_sum(opt, o2, "calls")),
        ],
        [
            f"total received ({unit_name})",
            fmt(max(mr.totals(m).recv for m in base)),
            fmt(max(mr.totals(m).recv for m in opt)),
            pct(max(mr.totals(m).recv for m in base), max(mr.totals(m).recv for m in opt)),
        ],
    ]


def uniform_params(n: int, m: int, k: int) -> list[mr.DenseParam]:
    """n layers of m equal 64x64 parameters, the first k of each layer TP-split."""
    return [
        mr.DenseParam(f"layers.{i}.p{j}", (64, 64), 0 if j < k else None, layer=i)
        for i in range(n)
        for j in range(m)
    ]


# ----------------------------------------------------------------------------- gloo run


def tiny_spec(num_experts: int = 16, num_layers: int = 4, hidden: int = 16, ffn: int = 8) -> mr.ModelSpec:
    """A DeepSeek-shaped toy: layer 0 dense, the rest MoE, MLA-like dense parameters with TP splits."""
    experts = (
        mr.ExpertParam("mlp.experts.w1", (2 * ffn, hidden)),
        mr.ExpertParam("mlp.experts.w2", (hidden, ffn)),
    )
    dense = [mr.DenseParam("embed_tokens", (32, hidden), 0, layer=-1)]
    for i in range(num_layers):
        p = f"layers.{i}."
        dense += [
            mr.DenseParam(p + "input_layernorm", (hidden,), layer=i),
            mr.DenseParam(p + "self_attn.q_b_proj", (4 * hidden, 8), 0, layer=i),
            mr.DenseParam(p + "self_attn.o_proj", (hidden, 4 * hidden), 1, layer=i),
            mr.DenseParam(p + "mlp.gate", (num_experts, hidden), dtype="float32", layer=i),
        ]
    dense += [
        mr.DenseParam("norm", (hidden,), layer=num_layers),
        mr.DenseParam("lm_head", (32, hidden), 0, layer=num_layers),
    ]
    return mr.ModelSpec(num_layers, tuple(range(1, num_layers)), num_experts, experts, tuple(dense))


def full_tensor(name: str, shape: Sequence[int], dtype: str, seed: int) -> Any:
    """The reference value of a full tensor: the same on every process, whatever its rank."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    return torch.randn(tuple(shape), generator=g).to(getattr(torch, dtype))


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def run_scenario(
    train: mr.TrainLayout, rollout: mr.RolloutLayout, model: mr.ModelSpec, seed: int = 0
) -> dict:
    """On this process (torch.distributed up): reshard experts and dense both ways; results and meters."""
    import torch.distributed as dist

    rank = dist.get_rank()
    groups = mr.build_groups(train)
    plan = mr.plan_experts(train, rollout, model.num_experts)
    dplan = mr.plan_dense(train, model.dense_params, model.num_layers)
    out: dict[str, Any] = {"method": plan.method}
    for label, baseline in (("plan", False), ("baseline", True)):
        meter: mr.Meter = {}
        ok = True
        for layer in model.moe_layers:
            stage = train.stage_of_layer(layer, model.num_layers)
            for prm in model.expert_params:
                full = full_tensor(
                    f"layers.{layer}.{prm.name}", (model.num_experts, *prm.shape), prm.dtype, seed
                )
                held = list(train.experts_held(rank, model.num_experts))
                local = full[held].clone() if train.stage(rank) == stage else None
                got = mr.reshard_experts(
                    plan, stage, local, prm, groups=groups, meter=meter, baseline=baseline
                )
                ok &= _same_bits(got, full[list(rollout.experts_needed(rank, model.num_experts))])
        out[f"experts_{label}"] = {"ok": ok, "meter": {k: asdict(v) for k, v in meter.items()}}
        meter = {}
        fulls = {p.name: full_tensor(p.name, p.shape, p.dtype, seed) for p in model.dense_params}
        local = {
            n: mr.shard_dense(train, dplan.param(n), t, rank)
            for n, t in fulls.items()
            if dplan.stage_of[n] == train.stage(rank)
        }
        got = mr.reshard_dense(dplan, local, groups=groups, meter=meter, baseline=baseline)
        ok = set(got) == set(fulls) and all(_same_bits(got[n], fulls[n]) for n in fulls)
        out[f"dense_{label}"] = {"ok": ok, "meter": {k: asdict(v) for k, v in meter.items()}}
    return out


def planned(
    train: mr.TrainLayout, rollout: mr.RolloutLayout, model: mr.ModelSpec, rank: int
) -> dict[str, mr.Meter]:
    """The planner's meters for run_scenario's four runs on `rank`."""
    plan = mr.plan_experts(train, rollout, model.num_experts)
    dplan = mr.plan_dense(train, model.dense_params, model.num_layers)
    return {
        "experts_plan": mr.expert_traffic(plan, model, rank),
        "experts_baseline": mr.expert_traffic(plan, model, rank, baseline=True),
        "dense_plan": mr.dense_traffic(dplan, rank),
        "dense_baseline": mr.dense_traffic(dplan, rank, baseline=True),
    }


def _worker(rank: int, world: int, port: int, scenarios: list, outdir: str, timeout_s: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        results = [run_scenario(*sc) for sc in scenarios]
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(world: int, scenarios: list, timeout_s: float = 120.0) -> list[list[dict]]:
    """Run scenarios [(train, rollout, model), ...] on `world` CPU processes over gloo; per-rank results."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="reshard-") as outdir:
        ctx = mp.start_processes(
            _worker,
            args=(world, free_port(), scenarios, outdir, timeout_s),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gloo run of {world} processes did not finish in {timeout_s:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        return [json.loads(Path(outdir, f"rank{r}.json").read_text()) for r in range(world)]


def measured_section(world: int, timeout_s: float) -> tuple[str, bool]:
    """Run the seed's small layout on gloo; table of measured vs planned figures."""
    pp = 2
    train = mr.TrainLayout(world, tp=2, ep=world // pp, pp=pp)
    rollout = mr.RolloutLayout(world, ep=world)
    model = tiny_spec(num_experts=2 * world)
    results = run_gloo(world, [(train, rollout, model)], timeout_s)
    rows, all_ok = [], True
    for run in ("experts_baseline", "experts_plan", "dense_baseline", "dense_plan"):
        plan = [mr.totals(planned(train, rollout, model, r)[run]) for r in range(world)]
        meas = [
            mr.totals({k: mr.Traffic(**v) for k, v in results[r][0][run]["meter"].items()})
            for r in range(world)
        ]
        ok = all(results[r][0][run]["ok"] for r in range(world))
        match = all(asdict(meas[r]) == asdict(plan[r]) for r in range(world))
        all_ok &= ok and match
        rows.append(
            [
                run,
                str(max(t.sent for t in meas)),
                str(max(t.recv for t in meas)),
                str(max(t.peak_extra for t in meas)) if run.startswith("experts") else "-",
                str(max(t.calls for t in meas)),
                "yes" if ok else "NO",
                "yes" if match else "NO",
            ]
        )
    title = (
        f"Measured on gloo: {world} CPU processes, training TP{train.tp} EP{train.ep} PP{train.pp} -> rollout "
        f"EP{rollout.ep} PP1, {model.num_experts} experts, {len(model.moe_layers)} MoE layers (bytes, max over ranks)"
    )
    header = ["run", "sent B", "recv B", "peak extra B", "calls", "bit-identical", "= planner"]
    return _table(title, header, rows), all_ok


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="4,8,8", metavar="TP,EP,PP", help="training layout (default: 4,8,8)")
    ap.add_argument(
        "--rollout-ep",
        type=int,
        nargs="+",
        default=[128, 256],
        metavar="EP",
        help="rollout EP sizes; the world is max(EP, TP*PP) cards (default: 128 256)",
    )
    ap.add_argument(
        "--measure-world",
        type=int,
        default=8,
        choices=[0, 4, 8],
        help="processes of the measured gloo run, 0 to skip (default: 8)",
    )
    ap.add_argument(
        "--timeout", type=float, default=180.0, help="seconds the gloo run may take (default: 180)"
    )
    args = ap.parse_args(argv)
    try:
        tp, ep, pp = (int(x) for x in args.train.split(","))
    except ValueError:
        ap.error(f"--train must be TP,EP,PP integers, got {args.train!r}")
    model = mr.deepseek_v3_spec()
    w1 = model.expert_params[0]
    out(
        f"DeepSeek-V3: {model.num_layers} layers ({len(model.moe_layers)} MoE), {model.num_experts} routed experts, "
        f"hidden 7168, expert FFN 2048, bf16; one expert's {w1.name} = {w1.nbytes:,} B = {gib(w1.nbytes)} GiB\n"
    )
    for rep in args.rollout_ep:
        world = max(rep, tp * pp)
        try:
            train = mr.TrainLayout(world, tp=tp, ep=ep, pp=pp)
            plan, rows = expert_rows(train, mr.RolloutLayout(world, ep=rep), model)
        except ValueError as exc:
            out(f"error: {exc}; choose layouts that fit one world")
            return 2
        title = (
            f"Routed experts: training TP{tp} EP{ep} PP{pp} -> rollout EP{rep} PP1, {world} cards, "
            f"method {plan.method} (max over ranks)"
        )
        out(_table(title, ["per rank", "baseline", "plan", "reduction"], rows))
    world = max(args.rollout_ep[0], tp * pp)
    train = mr.TrainLayout(world, tp=tp, ep=ep, pp=pp)
    n, m, k = 64, 4, 4
    out(
        _table(
            f"TP-split parameters across PP, formula check: n={n} layers, m=k={m} TP-split parameters of one unit, "
            f"t={tp}, p={pp} (volume n*m/t -> n*m/p)",
            ["per card", "baseline", "TP then PP", "reduction"],
            dense_rows(mr.TrainLayout(tp * pp, tp=tp, pp=pp), uniform_params(n, m, k), n, unit=64 * 64 * 2),
        )
    )
    out(
        _table(
            f"TP-split parameters across PP, DeepSeek-V3 dense weights, training TP{tp} PP{pp} (max over ranks)",
            ["per card", "baseline", "TP then PP", "reduction"],
            dense_rows(train, model.dense_params, model.num_layers),
        )
    )
    if args.measure_world:
        try:
            text, ok = measured_section(args.measure_world, args.timeout)
        except (TimeoutError, RuntimeError) as exc:
            out(f"error: measured gloo run failed: {exc}; rerun with a larger --timeout or --measure-world 0")
            return 1
        out(text)
        if not ok:
            out("error: the measured run differs from the reference or from the planner")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
