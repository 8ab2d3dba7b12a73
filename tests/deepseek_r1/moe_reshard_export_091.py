"""Driver: ds-0206's AlltoAllV expert reshard inside verl 0.9.1's MegatronEngine export, on 2 gloo ranks.

Run by tests/deepseek_r1/test_moe_reshard_export_091.py (full tier) under torch.distributed.run with 2 processes,
on a verl 0.9.1 tree carrying the Qwen 0.9.1 series, the CPU overlay and ds-0206 (so verl/utils/megatron/
expert_reshard.py and moe_reshard.py are the installed copies), with megatron-core 0.16 and Megatron-Bridge 0.3.1
importable. Each rank builds the real engine (EngineRegistry.new(..., backend="megatron"), initialize(), the
checkpoint loaded through the bridge) on a tiny random DeepSeek-V3 and calls engine.get_per_tensor_param as
0.9.1's ActorRolloutRefWorker.update_weights does, several times in the same run:

- `allgather`: no rollout_config (the bridge's own export: PP broadcast, EP all-gather of every expert);
- `alltoallv_ep2`: rollout_config with expert_reshard=alltoallv, rollout TP 1 x DP 2 = EP 2 (rank r keeps block r,
  the block it trains: every expert is a local copy, no collective);
- `alltoallv_ep1`: rollout TP 2, EP off (every rank keeps every expert: rank r receives the other block by
  all_to_all_single);
- `swapped_blocks`: the installed planner told that rollout rank r keeps the other rank's block (a rollout that
  keeps another block than training holds); checked against that map (it must hold) and, as a negative control,
  against the real one (it must fail);
- negative control `wrong_local_id`: the adapter's local expert index shifted by one (bit-equality must fail).

With --pp 2 the same on training PP 2 x EP 1 (the tiny model's MoE layer is on stage 1, so rank 0 holds no routed
expert): the bridge broadcasts every expert to stage 0, the adapter sends stage 0's rollout block straight from its
owner.

Memory: every torch.distributed.all_gather / all_to_all_single / broadcast call during an export is wrapped (the
bridge and the executor call them through torch.distributed; all_gather_object's internal calls do not go through
the wrapper), and each output tensor (for a broadcast, the receiver's buffer) is tracked by a weakref finalizer:
`collective_bytes` is what the calls allocated, `collective_peak_bytes` the largest sum alive at one time while the
consumer copies each yielded tensor and drops it (what the rollout's bucketed load does). The `expert_` figures count
only the collectives issued for routed experts: while the bridge converts a routed-expert task (its mapping's
megatron_to_hf is wrapped to mark it) and the adapter's all_to_all_single calls. Byte counts of tensors, not RSS.

No monkeypatch of the engine: what the CPU needs is the overlay's (cpu-0014, cpu-0016, cpu-0017), the engine is
built as ascend_rl/harness/megatron_engine_091.py builds it (its build_engine: TrainingWorker's EngineRegistry.new,
fp32, the DeepSeek CPU profile's override_transformer_config), in verl 0.9.1's e2e environment with the 0.9.1
Megatron packages (artifacts.megatron_packages) and the repository on PYTHONPATH, the recipe's CPU launch environment. The only
monkeypatches are this driver's own controls (the swapped block map, the shifted local id, mbridge's flag).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import weakref
from pathlib import Path

EXPERT = ".mlp.experts."


# True while the bridge converts a routed-expert task (set by mark_expert_tasks): the meter files what the
# collectives allocate then under "experts"; the adapter's all_to_all_single calls carry routed experts only
EXPERT_SCOPE = [False]


def mark_expert_tasks(engine, is_expert) -> int:
    """Wrap each routed-expert task's mapping.megatron_to_hf (the engine's cached conversion tasks) so that the meter
    knows which collectives the bridge issues for routed experts. Measurement only: the results are unchanged."""
    count = 0
    for task in engine._mbridge_export_tasks():
        if not is_expert(task):
            continue
        convert = task.mapping.megatron_to_hf

        def in_scope(*args, _convert=convert, **kwargs):
            EXPERT_SCOPE[0] = True
            try:
                return _convert(*args, **kwargs)
            finally:
                EXPERT_SCOPE[0] = False

        task.mapping.megatron_to_hf = in_scope
        count += 1
    return count


class CollectiveMeter:
    """Bytes of the outputs of torch.distributed.all_gather / all_to_all_single / broadcast (the receivers' buffers)
    while installed, in total and for routed experts: calls, bytes allocated, the peak alive at one time."""

    def __init__(self):
        import torch.distributed as dist

        self.dist = dist
        self.live = {"all": 0, "experts": 0}
        self.peak = {"all": 0, "experts": 0}
        self.total = {"all": 0, "experts": 0}
        self.calls = {"all": 0, "experts": 0}
        self.by_op: dict[str, int] = {}

    def _track(self, op: str, tensors) -> None:
        kinds = ("all", "experts") if EXPERT_SCOPE[0] or op == "all_to_all_single" else ("all",)
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            for kind in kinds:
                self.live[kind] += nbytes
                self.total[kind] += nbytes
            self.by_op[op] = self.by_op.get(op, 0) + nbytes
            weakref.finalize(tensor, self._release, kinds, nbytes)
        for kind in kinds:
            self.calls[kind] += 1
            self.peak[kind] = max(self.peak[kind], self.live[kind])

    def _release(self, kinds, nbytes: int) -> None:
        for kind in kinds:
            self.live[kind] -= nbytes

    def __enter__(self):
        dist = self.dist
        self.saved = (dist.all_gather, dist.all_to_all_single, dist.broadcast)
        all_gather, all_to_all_single, broadcast = self.saved

        def bcast(tensor, src=None, *args, **kwargs):
            out = broadcast(tensor, src, *args, **kwargs)
            if src is not None and dist.get_rank() != src:  # a buffer the receiver allocated for it
                self._track("broadcast", [tensor])
            return out

        def gather(tensor_list, tensor, *args, **kwargs):
            out = all_gather(tensor_list, tensor, *args, **kwargs)
            self._track("all_gather", tensor_list)
            return out

        def alltoall(output, input, *args, **kwargs):
            out = all_to_all_single(output, input, *args, **kwargs)
            self._track("all_to_all_single", [output])
            return out

        dist.all_gather, dist.all_to_all_single, dist.broadcast = gather, alltoall, bcast
        return self

    def __exit__(self, *exc):
        self.dist.all_gather, self.dist.all_to_all_single, self.dist.broadcast = self.saved

    def figures(self) -> dict:
        return {
            "collective_calls": self.calls["all"],
            "collective_bytes": self.total["all"],
            "collective_peak_bytes": self.peak["all"],
            "expert_collective_calls": self.calls["experts"],
            "expert_collective_bytes": self.total["experts"],
            "expert_collective_peak_bytes": self.peak["experts"],
            "by_op": self.by_op,
        }


def export(engine, rollout_config, report_path: Path | None = None) -> tuple[dict, dict]:
    """{name: copy} of what the engine's export yields on this rank, and the collective figures."""
    import torch

    if report_path is not None:
        os.environ["RECIPE_RESHARD_REPORT"] = str(report_path)
    out: dict[str, torch.Tensor] = {}
    with CollectiveMeter() as meter:
        kwargs = {} if rollout_config is None else {"rollout_config": rollout_config}
        gen, _ = engine.get_per_tensor_param(base_sync_done=True, **kwargs)
        for name, tensor in gen:
            assert name not in out, f"{name} yielded twice"
            out[name] = tensor.detach().clone()  # the rollout's copy into its own weights
            del tensor
    os.environ.pop("RECIPE_RESHARD_REPORT", None)
    return out, meter.figures()


def compare(got: dict, reference: dict, kept: set[str]) -> dict:
    """The routed-expert names got against what the rollout rank keeps, and bit-equality with the reference."""
    got_experts = {k for k in got if EXPERT in k and ".shared_experts." not in k}
    others = set(got) - got_experts
    ref_others = {k for k in reference if not (EXPERT in k and ".shared_experts." not in k)}
    return {
        "expert_names": len(got_experts),
        "expert_names_equal_kept": got_experts == kept,
        "missing_kept": sorted(kept - got_experts)[:4],
        "extra": sorted(got_experts - kept)[:4],
        "experts_bit_equal": all(k in reference and torch_equal(got[k], reference[k]) for k in got_experts),
        "experts_unequal": sorted(
            k for k in got_experts if k in reference and not torch_equal(got[k], reference[k])
        )[:4],
        "others_equal": others == ref_others and all(torch_equal(got[k], reference[k]) for k in others),
    }


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def kept_names(reference: dict, experts: set[int]) -> set[str]:
    import re

    return {
        k
        for k in reference
        if EXPERT in k
        and ".shared_experts." not in k
        and int(re.search(r"experts\.(\d+)\.", k).group(1)) in experts
    }


def read_report(path: Path, rank: int) -> list[dict]:
    if not path.exists():
        return []
    return [row for row in map(json.loads, path.read_text().splitlines()) if row["rank"] == rank]


def planner_bytes(
    mr, train, rollout_ep: int, num_experts: int, expert_tensors: dict, rank: int, num_layers: int
):
    """The planner's recv / sent bytes for this rank over every (layer, parameter) of the export, computed here from
    the pure planner and the exported tensors' shapes (one expert's tensor per (layer, Megatron parameter)), each on
    the PP stage that owns its layer."""
    plan = mr.plan_experts(train, mr.RolloutLayout(train.world_size, ep=rollout_ep), num_experts)
    recv = sent = 0
    for key, nbytes in expert_tensors.items():
        stage = train.stage_of_layer(int(key.split(".")[0]), num_layers)
        step = mr.expert_step_traffic(plan, rank, stage, nbytes)
        recv, sent = recv + step["recv"], sent + step["sent"]
    return {"recv": recv, "sent": sent}


def build_engine(model: Path, ep: int, pp: int):
    """The harness driver's engine (ascend_rl/harness/megatron_engine_091.py), with PP `pp` when above 1: its
    McoreEngineConfig is given pipeline_model_parallel_size (configuration, not a patch of the engine)."""
    import functools

    import verl.workers.config as config

    from ascend_rl.harness import megatron_engine_091 as driver  # the repository, on the caller's PYTHONPATH

    if pp == 1:
        return driver.build_engine(model, ep)
    original = config.McoreEngineConfig
    config.McoreEngineConfig = functools.partial(original, pipeline_model_parallel_size=pp)
    try:
        return driver.build_engine(model, ep)
    finally:
        config.McoreEngineConfig = original


def run(args) -> dict:
    import re

    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pp = args.pp
    ep = world // pp
    engine = build_engine(args.model, ep, pp)
    engine.initialize()

    import verl.utils.megatron.expert_reshard as adapter
    import verl.utils.megatron.moe_reshard as mr
    from verl.workers.config import RolloutConfig

    assert Path(adapter.__file__).resolve().is_relative_to(Path(args.tree).resolve()), adapter.__file__
    num_experts = engine.tf_config.num_moe_experts
    num_layers = engine.model_config.hf_config.num_hidden_layers
    marked = mark_expert_tasks(engine, adapter.is_routed_expert_task)
    train = mr.TrainLayout(world, ep=ep, pp=pp)
    result: dict = {
        "rank": rank,
        "world": world,
        "ep": ep,
        "pp": pp,
        "num_experts": num_experts,
        "expert_tasks": marked,
        "verl": str(Path(adapter.__file__)),
    }

    def rollout(tp: int, dp: int, ep: int, mode: str = "alltoallv"):
        return RolloutConfig(
            name="vllm",
            tensor_model_parallel_size=tp,
            data_parallel_size=dp,
            expert_parallel_size=ep,
            expert_reshard=mode,
        )

    try:
        rollout(1, 2, 2, mode="bogus")
        result["config_refuses_bogus"] = False
    except ValueError as exc:
        result["config_refuses_bogus"] = "rollout.expert_reshard must be" in str(exc)

    reference, result["allgather"] = export(engine, None)
    per = num_experts // world
    # one (layer, Megatron parameter) = one entry: fc1 (gate + up fused) and fc2 bytes of ONE expert, from HF names
    expert_tensors: dict[str, int] = {}
    for k, v in reference.items():
        m = re.search(r"layers\.(\d+)\.mlp\.experts\.0\.(gate_proj|up_proj|down_proj)", k)
        if m:
            key = f"{m.group(1)}.{'fc2' if m.group(2) == 'down_proj' else 'fc1'}"
            expert_tensors[key] = expert_tensors.get(key, 0) + v.numel() * v.element_size()
    result["expert_tensor_bytes"] = expert_tensors
    result["allgather"]["expert_names"] = sum(
        1 for k in reference if EXPERT in k and ".shared_experts." not in k
    )
    result["allgather"]["kept_names"] = len(kept_names(reference, set(range(rank * per, (rank + 1) * per))))

    work = Path(args.work)
    layouts = {
        # name: (rollout tp, dp, ep, experts this rollout rank keeps, the planner's rollout EP)
        "alltoallv_ep2": (1, world, world, set(range(rank * per, (rank + 1) * per)), world),
        "alltoallv_ep1": (world, 1, 1, set(range(num_experts)), 1),
    }
    for name, (tp, dp, ep, keeps, plan_ep) in layouts.items():
        report = work / f"{name}.jsonl"
        got, figures = export(engine, rollout(tp, dp, ep), report)
        rows = read_report(report, rank)
        result[name] = {
            **figures,
            **compare(got, reference, kept_names(reference, keeps)),
            "report": rows,
            "plan": planner_bytes(mr, train, plan_ep, num_experts, expert_tensors, rank, num_layers),
        }

    # a rollout that keeps the other block than the rank trains: the installed planner is told that rollout rank r
    # keeps block r+1 (as a vLLM engine whose EP ranks run in the other order would); against that map every rank
    # must receive exactly the other block, bit-equal, with the bytes of that plan. Against the real map (rank r
    # keeps block r) the same export is the negative control: wrong names, bytes off the plan.
    original = mr.RolloutLayout.experts_needed

    def other_block(self, r, n):
        return original(self, (r + 1) % self.world_size, n)

    mr.RolloutLayout.experts_needed = other_block
    try:
        report = work / "swapped_blocks.jsonl"
        got, figures = export(engine, rollout(1, world, world), report)
        swapped_plan = planner_bytes(mr, train, world, num_experts, expert_tensors, rank, num_layers)
    finally:
        mr.RolloutLayout.experts_needed = original
    other = (rank + 1) % world
    result["swapped_blocks"] = {
        **figures,
        **compare(got, reference, kept_names(reference, set(range(other * per, (other + 1) * per)))),
        "report": read_report(report, rank),
        "plan": swapped_plan,
    }
    result["swapped_blocks_against_the_real_map"] = {
        **compare(got, reference, kept_names(reference, set(range(rank * per, (rank + 1) * per)))),
        "plan": planner_bytes(mr, train, world, num_experts, expert_tensors, rank, num_layers),
    }

    # negative control 2: the adapter reads each task's local expert index one off
    original_id = adapter.local_expert_id
    adapter.local_expert_id = lambda task, per_rank: (original_id(task, per_rank) + 1) % per_rank
    try:
        got, figures = export(engine, rollout(world, 1, 1), work / "wrong_local_id.jsonl")
    finally:
        adapter.local_expert_id = original_id
    result["wrong_local_id"] = {
        **figures,
        **compare(got, reference, kept_names(reference, set(range(num_experts)))),
    }

    # a fallback: with mbridge's export (vanilla_mbridge) the adapter hands back the engine's own stream
    engine.vanilla_bridge, saved = True, engine.vanilla_bridge
    try:
        result["fallback_is_default"] = adapter.export_hf_weights_alltoallv(
            engine, "DEFAULT", rollout(1, world, world)
        )
    finally:
        engine.vanilla_bridge = saved
    dist.barrier()
    dist.destroy_process_group()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree", required=True, help="the verl 0.9.1 tree (CPU overlay + ds-0206), on PYTHONPATH"
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="a tiny DeepSeek-V3 checkpoint (ascend_rl.tiny.deepseek_v3)"
    )
    parser.add_argument("--work", type=Path, required=True, help="a folder for the per-sync byte reports")
    parser.add_argument("--out", type=Path, required=True, help="each rank writes OUT.rank<r>.json")
    parser.add_argument("--pp", type=int, default=1, help="training PP (EP = the process count / PP)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    result = run(args)
    Path(f"{args.out}.rank{result['rank']}.json").write_text(json.dumps(result, indent=1, default=str))
    print("RESHARD091 " + json.dumps({k: result[k] for k in ("rank", "world", "num_experts")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
