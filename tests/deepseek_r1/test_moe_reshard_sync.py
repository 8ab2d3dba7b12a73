"""Patch ds-0006 (routed experts of the Megatron weight sync by AlltoAllV) on the deepseek_r1-patched verl 0.6.0.

megatron-core is not installed, so the patched per_tensor_generator cannot run here: its new branch is checked at
the source level, while the logic it calls (verl/utils/megatron/expert_reshard.py and the planner installed beside it,
verl/utils/megatron/moe_reshard.py, both from the patched tree) runs on gloo processes against the all-gather baseline that 0.6.0's generator does
(PP broadcast, EP all-gather, every expert on every rank). Which experts a rollout rank keeps comes from vLLM
0.13.0's own determine_expert_map (taken out of the real wheel) and verl's VLLM_DP_RANK (patch ds-0002).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import py_compile
import socket
import subprocess
import sys
import typing
import zipfile
from pathlib import Path

import pytest
import torch

from ascend_rl import moe_reshard as mr

SHIM = "verl/utils/megatron/expert_reshard.py"
PLANNER = "verl/utils/megatron/moe_reshard.py"
UTILS = "verl/utils/megatron_utils.py"
WORKERS = "verl/workers/megatron_workers.py"
HIDDEN, FFN = (
    4,
    3,
)  # tiny expert shapes: linear_fc1 (2*FFN, HIDDEN) float32, linear_fc2 (HIDDEN, FFN) bfloat16


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    """The deepseek_r1-patched verl 0.6.0 tree (shared, read only)."""
    return patched_verl("deepseek_r1")


def test_patched_files_compile(patched, tmp_path):
    for rel in (SHIM, UTILS, WORKERS, "verl/workers/config/rollout.py"):
        py_compile.compile(str(patched / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)


def _function(path: Path, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    )


def test_generator_takes_the_new_branch_only_when_the_key_says_alltoallv(patched):
    # source level: megatron-core is absent, so per_tensor_generator cannot be called here
    gen = _function(patched / UTILS, "per_tensor_generator")
    assert [a.arg for a in gen.args.args][-1] == "rollout_config"
    assert isinstance(gen.args.defaults[-1], ast.Constant) and gen.args.defaults[-1].value is None
    ifs = [n for n in ast.walk(gen) if isinstance(n, ast.If)]
    (setup,) = [n for n in ifs if "make_expert_reshard" in ast.unparse(n.body)]
    assert ast.unparse(setup.test) == (
        "ep_size > 1 and rollout_config is not None and "
        "(rollout_config.get('expert_reshard', 'allgather') != 'allgather')"
    )
    assigned = [
        n
        for n in ast.walk(gen)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "expert_reshard"
    ]
    assert [ast.unparse(n.value) for n in assigned][0] == "None"  # off unless the setup branch ran
    (branch,) = [n for n in ifs if "expert_reshard.route" in ast.unparse(n)]
    assert ast.unparse(branch.test) == "expert_reshard is not None and '.mlp.experts.linear_fc' in cur_name"
    assert isinstance(branch.body[-1], ast.Continue)
    loop = next(n for n in ast.walk(gen) if isinstance(n, ast.For) and branch in n.body)
    pp_broadcast = next(
        i for i, s in enumerate(loop.body) if "broadcast_from_megatron_pp(cur_tensor)" in ast.unparse(s)
    )
    assert loop.body.index(branch) < pp_broadcast  # the expert tensor skips the PP broadcast
    rollout_mode = _function(patched / WORKERS, "rollout_mode")
    assert "rollout_config=self.config.rollout" in ast.unparse(rollout_mode)


CONFIG_PROBE = r"""
import json, sys
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

tree, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for overrides in cases:
    with initialize_config_dir(config_dir=tree + "/verl/trainer/config", version_base=None):
        cfg = compose(config_name="ppo_megatron_trainer", overrides=overrides)
    try:
        out.append(["ok", omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).expert_reshard])
    except Exception as exc:  # hydra wraps the dataclass's ValueError
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""


def test_key_composes_with_the_megatron_trainer_and_a_bad_value_is_refused(patched):
    base = ["actor_rollout_ref.rollout.name=vllm"]
    cases = [base, [*base, "actor_rollout_ref.rollout.expert_reshard=alltoallv"]]
    cases.append([*base, "actor_rollout_ref.rollout.expert_reshard=alltoall"])
    proc = subprocess.run(
        [sys.executable, "-c", CONFIG_PROBE, str(patched), json.dumps(cases)],
        env={**os.environ, "PYTHONPATH": str(patched)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    default, on, bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert default == ["ok", "allgather"]
    assert on == ["ok", "alltoallv"]
    assert bad[0] == "refused" and "expert_reshard must be allgather" in bad[1] and "'alltoall'" in bad[1]


IMPORT_PROBE = r"""
import json, sys
from verl.utils.megatron import expert_reshard
planner = expert_reshard.load_moe_reshard()
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("ascend_rl", "llm_rl"))
sys.modules[expert_reshard.MODULE] = None  # as if the planner were not installed
try:
    expert_reshard.load_moe_reshard()
    missing = ""
except ImportError as exc:
    missing = str(exc)
print(json.dumps({"planner": planner.__file__, "ours": ours, "missing": missing}))
"""


def test_the_shim_imports_the_planner_installed_beside_it_and_nothing_of_this_repository(patched, tmp_path):
    """With only the patched tree on the path (as in a user's site-packages), the shim finds the planner in verl;
    without it, one line saying how to restore it."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        env={**os.environ, "PYTHONPATH": str(patched)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["planner"] == str(patched / PLANNER)
    assert got["ours"] == [], "the patched tree imported this repository at run time"
    assert "overlay apply" in got["missing"] and "\n" not in got["missing"]


def test_per_tensor_moves_add_up_to_the_plan():
    plan = mr.plan_experts(mr.TrainLayout(16, tp=2, ep=4, pp=2), mr.RolloutLayout(16, ep=8), 16)
    for stage in range(2):
        for rank in range(16):
            steps = [mr.tensor_step_traffic(plan, rank, stage, j, 10) for j in range(4)]
            whole = mr.expert_step_traffic(plan, rank, stage, 10)
            for key in ("sent", "recv", "buffer"):
                assert sum(s[key] for s in steps) == whole[key], (stage, rank, key)


# ----------------------------------------------------------------------------- gloo runs

WORKER = r"""
import json, os, sys, importlib.util
from datetime import timedelta
import torch, torch.distributed as dist

rank, world, port, spec_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
spec = json.loads(open(spec_file).read())

def load(name, path):
    m = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(m)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    m.loader.exec_module(module)
    return module

# the patched tree's two files, without importing the rest of verl (the import itself: IMPORT_PROBE)
shim = load("expert_reshard_shim", spec["shim"])
planner = load(shim.MODULE, spec["planner"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=spec["timeout"]))
H, F = spec["hidden"], spec["ffn"]
PARAMS = ((1, (2 * F, H), torch.float32), (2, (H, F), torch.bfloat16))

def weight(layer, fc, expert, shape, dtype):
    g = torch.Generator().manual_seed(layer * 100003 + fc * 1009 + expert)
    return torch.randn(shape, generator=g).to(dtype)

for i, sc in enumerate(spec["scenarios"]):
    sys.modules[shim.MODULE] = planner if sc["planner_installed"] else None
    tp, ep, pp, n = sc["train"]
    r_tp, r_dp, r_ep = sc["rollout"]
    size = world // pp
    stage, k, per = rank // size, rank % size % ep, n // ep
    layout = shim.ExpertSyncLayout(world_size=world, rank=rank, train_tp=tp, train_ep=ep, train_pp=pp, expert_tp=1,
                                   ep_rank=k, pp_rank=stage, num_experts=n, rollout_tp=r_tp, rollout_dp=r_dp,
                                   rollout_ep=r_ep)
    meter = {}
    router = shim.make_expert_reshard("alltoallv", layout, meter=meter)
    print(f"scenario {i} done planning", file=sys.stderr, flush=True)
    pp_groups = [dist.new_group(list(range(s, world, size))) for s in range(size)]
    ep_groups = [dist.new_group(list(range(s, s + ep))) for s in range(0, world, ep)]
    pp_group, ep_group = pp_groups[rank % size], ep_groups[rank // ep]
    base, routed = {}, {}
    for layer in range(sc["layers"]):
        owner = layer * pp // sc["layers"]
        for fc, shape, dtype in PARAMS:
            for j in range(per):
                name = f"decoder.layers.{layer}.mlp.experts.linear_fc{fc}.weight{j}"
                t = weight(layer, fc, k * per + j, shape, dtype) if stage == owner else None
                # 0.6.0's baseline: PP broadcast, EP all-gather, every global expert on every rank
                buf = t.clone() if t is not None else torch.empty(shape, dtype=dtype)
                if pp > 1:
                    dist.broadcast(buf, src=owner * size + rank % size, group=pp_group)
                parts = [torch.empty_like(buf) for _ in range(ep)]
                dist.all_gather(parts, buf, group=ep_group)
                prefix = name.split(".weight")[0]
                for e, p in enumerate(parts):
                    base[f"{prefix}.weight{per * e + j}"] = p
                if router is not None:
                    for gname, p in router.route(name, t, owner, shape, dtype):
                        assert gname not in routed, gname
                        routed[gname] = p.clone()
    torch.save({"base": base, "routed": routed, "method": "alltoallv" if router else "allgather",
                "meter": {s: vars(v) for s, v in meter.items()}}, f"{out}/rank{rank}_{i}.pt")
    print(f"scenario {i} end", file=sys.stderr, flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_gloo(patched: Path, tmp_path: Path, world: int, scenarios: list[dict], timeout_s: int = 150):
    worker, spec = tmp_path / "worker.py", tmp_path / "spec.json"
    worker.write_text(WORKER)
    spec.write_text(
        json.dumps(
            {
                "shim": str(patched / SHIM),
                "planner": str(patched / PLANNER),
                "timeout": timeout_s,
                "hidden": HIDDEN,
                "ffn": FFN,
                "scenarios": scenarios,
            }
        )
    )
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(r), str(world), str(port), str(spec), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    errs = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout_s)
            errs.append(err)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [
        f"rank {r}: {err[-1500:]}" for r, (p, err) in enumerate(zip(procs, errs, strict=True)) if p.returncode
    ]
    assert not failed, "\n".join(failed)
    results = [
        [torch.load(tmp_path / f"rank{r}_{i}.pt", weights_only=True) for i in range(len(scenarios))]
        for r in range(world)
    ]
    return results, errs


@pytest.fixture(scope="module")
def vllm_expert_map(vllm_wheel):
    """vLLM 0.13.0's determine_expert_map, taken out of the real wheel's fused_moe/layer.py."""
    with zipfile.ZipFile(vllm_wheel) as whl:
        source = whl.read("vllm/model_executor/layers/fused_moe/layer.py").decode()
    fn = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "determine_expert_map"
    )
    namespace = {"torch": torch, "ExpertPlacementStrategy": str, "get_args": typing.get_args}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "layer.py", "exec"), namespace)
    return namespace["determine_expert_map"]


def _kept(
    patched: Path, expert_map, rank: int, world: int, rollout: tuple[int, int, int], n: int
) -> set[int]:
    """Global experts rollout rank `rank`'s vLLM engine keeps: EP rank = VLLM_DP_RANK x TP + TP rank."""
    tp, dp, ep = rollout
    if ep <= 1:
        return set(range(n))  # EP off: every rank loads every expert (sliced over TP by vLLM)
    spec = importlib.util.spec_from_file_location("ascend_dp", patched / "verl/utils/vllm/ascend_dp.py")
    ascend_dp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ascend_dp)
    env = ascend_dp.vllm_dp_env(rank, world, world, tp, dp, ["127.0.0.1"] * world, {})
    ep_rank = int(env["VLLM_DP_RANK"]) * tp + rank % tp
    _, emap, _ = expert_map(tp * dp, ep_rank, n)
    return {x for x in range(n) if emap[x] >= 0}


def _check(patched, expert_map, world, scenarios, results, errs):
    for i, sc in enumerate(scenarios):
        tp, ep, pp, n = sc["train"]
        plan = None
        if sc["expect"] == "alltoallv":
            rollout_ep = sc["rollout"][0] * sc["rollout"][1] if sc["rollout"][2] > 1 else 1
            plan = mr.plan_experts(
                mr.TrainLayout(world, tp=tp, ep=ep, pp=pp), mr.RolloutLayout(world, ep=rollout_ep), n
            )
        for rank in range(world):
            got = results[rank][i]
            assert got["method"] == sc["expect"], (i, rank)
            if plan is None:
                assert got["routed"] == {} and got["meter"] == {}
                continue
            kept = _kept(patched, expert_map, rank, world, sc["rollout"], n)
            want = {name: t for name, t in got["base"].items() if int(name.rsplit(".weight", 1)[1]) in kept}
            assert sorted(got["routed"]) == sorted(want), (i, rank)
            for name, t in want.items():
                r = got["routed"][name]
                assert r.dtype == t.dtype and r.shape == t.shape
                assert torch.equal(r.view(torch.uint8), t.view(torch.uint8)), (i, rank, name)  # bit-identical
            # bytes: the executor's meter against the planner's figures for every (layer, parameter)
            sent = recv = buffer = peak = 0
            for layer in range(sc["layers"]):
                owner = layer * pp // sc["layers"]
                for nbytes in (2 * FFN * HIDDEN * 4, HIDDEN * FFN * 2):
                    whole = mr.expert_step_traffic(plan, rank, owner, nbytes)
                    sent, recv = sent + whole["sent"], recv + whole["recv"]
                    for j in range(n // ep):
                        step = mr.tensor_step_traffic(plan, rank, owner, j, nbytes)
                        buffer, peak = buffer + step["buffer"], max(peak, step["extra"])
            meter = got["meter"].get(
                "experts/alltoallv", {"sent": 0, "recv": 0, "buffer": 0, "peak_extra": 0}
            )
            assert (meter["sent"], meter["recv"]) == (sent, recv), (i, rank)
            assert (meter["buffer"], meter["peak_extra"]) == (buffer, peak), (i, rank)
    for err in errs:
        fallback_lines = [line for line in err.splitlines() if "fall back" in line]
        assert len(fallback_lines) == sum(sc["expect"] == "allgather" for sc in scenarios), err[-2000:]


def _scenario(train, rollout, expect, planner_installed=True, layers=2):
    return {
        "train": train,
        "rollout": rollout,
        "expect": expect,
        "planner_installed": planner_installed,
        "layers": layers,
    }


@pytest.mark.slow
def test_gloo_world4_routed_experts_are_exactly_what_each_engine_keeps(patched, tmp_path, vllm_expert_map):
    scenarios = [
        _scenario((1, 2, 2, 8), (1, 4, 4), "alltoallv"),  # train EP2 PP2 -> rollout EP4
        _scenario((2, 2, 1, 4), (2, 1, 2), "alltoallv"),  # two rollout engines: one expert to two ranks
        _scenario((1, 4, 1, 8), (2, 2, 1), "alltoallv"),  # rollout EP off: every rank keeps every expert
        _scenario((1, 2, 2, 8), (1, 4, 4), "allgather", planner_installed=False),  # planner missing
    ]
    results, errs = _run_gloo(patched, tmp_path, 4, scenarios)
    _check(patched, vllm_expert_map, 4, scenarios, results, errs)
    assert all("verl.utils.megatron.moe_reshard cannot be imported" in err for err in errs)


@pytest.mark.slow
def test_gloo_world8_seed_layout(patched, tmp_path, vllm_expert_map):
    scenarios = [
        _scenario((1, 4, 2, 16), (1, 8, 8), "alltoallv", layers=3),  # the seed's EP4 PP2 -> EP8 PP1
        _scenario((2, 2, 2, 8), (2, 2, 4), "alltoallv"),  # TP2 EP2 PP2 -> two EP4 engines
    ]
    results, errs = _run_gloo(patched, tmp_path, 8, scenarios)
    _check(patched, vllm_expert_map, 8, scenarios, results, errs)


@pytest.mark.slow
def test_gloo_world6_non_dividing_layout_falls_back(patched, tmp_path, vllm_expert_map):
    # powers of two always divide one another: the divisibility condition can only fail on another world size
    scenarios = [
        _scenario((1, 3, 2, 6), (1, 6, 6), "alltoallv"),  # EP3 divides EP6
        _scenario((1, 3, 2, 6), (2, 1, 2), "allgather"),  # neither EP 3 nor EP 2 divides the other
    ]
    results, errs = _run_gloo(patched, tmp_path, 6, scenarios)
    _check(patched, vllm_expert_map, 6, scenarios, results, errs)
    assert all("neither training EP 3 nor rollout EP 2 divides" in err for err in errs)
