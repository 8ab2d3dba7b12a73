"""The train-to-rollout reshard: planner figures, gloo runs bit-exact against the reference, the benchmark."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import asdict

import pytest

from ascend_rl import moe_reshard as mr
from llm_rl.deepseek_r1 import bench_reshard as bench

W1 = 2 * 7168 * 2048 * 2  # bytes of one DeepSeek-V3 expert's fused gate/up weight
# experts of each of 4 EP ranks, out of order: sends need packing, receives a permutation
SHUFFLED = ((15, 10, 5, 0), (1, 12, 7, 2), (3, 14, 9, 4), (11, 6, 13, 8))


def test_planner_is_one_self_contained_file_that_imports_without_torch(tmp_path):
    """The overlay installs the file into verl (verl/utils/megatron/moe_reshard.py): loaded alone, by its path and
    from elsewhere, it needs neither torch (the planner) nor anything of this repository."""
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('moe_reshard', {mr.__file__!r}); "
        "m = importlib.util.module_from_spec(spec); sys.modules['moe_reshard'] = m; spec.loader.exec_module(m); "
        "print('torch' in sys.modules, sorted(x for x in sys.modules if x.split('.')[0] in ('ascend_rl', 'llm_rl')))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False []"


def test_w1_at_rollout_ep256_needs_one_expert_instead_of_256():
    train, rollout = mr.TrainLayout(256, tp=4, ep=8, pp=8), mr.RolloutLayout(256, ep=256)
    plan = mr.plan_experts(train, rollout, 256)
    assert plan.method == mr.ALLTOALLV
    steps = [mr.expert_step_traffic(plan, r, s, W1) for r in range(256) for s in range(8)]
    base = [
        kw for r in range(256) for s in range(8) for _, kw in mr.baseline_step_traffic(train, 256, r, s, W1)
    ]
    assert W1 == 58_720_256
    assert max(d["extra"] for d in base) == 256 * W1 == 14 * 2**30
    assert max(d["extra"] for d in steps) == W1
    assert max(d["recv"] for d in steps) == W1
    assert round(100 * (1 - W1 / (256 * W1)), 1) == 99.6


def test_tp_then_pp_halves_step1_volume_at_p8_t4():
    n, m, k, t, p = 64, 4, 4, 4, 8
    plan = mr.plan_dense(mr.TrainLayout(t * p, tp=t, pp=p), bench.uniform_params(n, m, k), n)
    unit = 64 * 64 * 2
    for rank in (0, 13, 31):
        base, opt = mr.dense_traffic(plan, rank, baseline=True), mr.dense_traffic(plan, rank)
        assert base["dense/pp_broadcast"].buffer == n * m * unit // t
        assert opt["dense/tp_allgather"].buffer == n * m * unit // p
        drop = (p - 1) * n * k // p
        assert base["dense/tp_allgather"].calls - opt["dense/tp_allgather"].calls == drop
        assert base["dense/pp_broadcast"].calls - opt["dense/pp_alltoall"].calls == drop
        assert "dense/pp_broadcast" not in opt  # every parameter found partners in all stages


@pytest.mark.parametrize(
    ("train", "rollout_ep", "experts"),
    [
        (mr.TrainLayout(8, tp=1, ep=4, pp=2), 8, 16),
        (mr.TrainLayout(8, tp=2, ep=2, pp=2), 4, 8),
        (mr.TrainLayout(128, tp=4, ep=8, pp=8), 128, 256),
        (
            mr.TrainLayout(8, tp=2, ep=4, pp=2, placement=SHUFFLED),
            8,
            16,
        ),
    ],
)
def test_every_needed_expert_comes_once_from_a_holder(train, rollout_ep, experts):
    rollout = mr.RolloutLayout(train.world_size, ep=rollout_ep)
    plan = mr.plan_experts(train, rollout, experts)
    for stage in range(train.pp):
        for dst in range(train.world_size):
            got = []
            for route in plan.recvs(dst, stage):
                assert train.stage(route.src) == stage
                assert set(route.experts) <= set(train.experts_held(route.src, experts))
                got += route.experts
            assert sorted(got) == list(rollout.experts_needed(dst, experts))


def test_shuffled_placement_needs_packing_and_the_planner_counts_it():
    plan = mr.plan_experts(mr.TrainLayout(8, ep=4, pp=2, placement=SHUFFLED), mr.RolloutLayout(8, ep=8), 16)
    assert any(plan.send_slice(r, 0) is None for r in range(4))
    assert any(not plan.recv_in_order(r, 0) for r in range(8))
    step = mr.expert_step_traffic(plan, 0, 0, 10)
    assert step["extra"] > step["buffer"]


def test_non_dividing_ep_sizes_fall_back_with_a_log_line(caplog):
    with caplog.at_level(logging.WARNING, logger=mr.__name__):
        plan = mr.plan_experts(mr.TrainLayout(6, ep=3, pp=2), mr.RolloutLayout(6, ep=2), 6)
    assert plan.method == mr.ALLGATHER
    assert "neither training EP 3 nor rollout EP 2 divides" in caplog.text
    assert "all-gather baseline" in caplog.text


@pytest.mark.parametrize(
    ("train", "rollout", "message"),
    [
        (mr.TrainLayout(8, tp=3), mr.RolloutLayout(8, ep=8), r"not a multiple of TP\*PP"),
        (mr.TrainLayout(8, ep=3), mr.RolloutLayout(8, ep=8), "does not divide"),
        (mr.TrainLayout(8, ep=4), mr.RolloutLayout(4, ep=4), "equal worlds"),
        (mr.TrainLayout(8, ep=2, placement=((0, 1), (1, 2))), mr.RolloutLayout(8, ep=2), "exactly once"),
    ],
)
def test_impossible_layouts_are_refused(train, rollout, message):
    with pytest.raises(ValueError, match=message):
        mr.plan_experts(train, rollout, 4)


def test_benchmark_prints_the_write_up_figures(capsys):
    assert bench.main(["--measure-world", "0"]) == 0
    out = capsys.readouterr().out
    ep256 = out[out.index("rollout EP256") :]
    peak = next(line for line in ep256.splitlines() if "peak extra" in line)
    assert peak.split()[-4:] == ["14.0000", "0.0547", "99.6", "%"]
    step1 = next(line for line in out.splitlines() if line.startswith("step 1 volume per card (params)"))
    assert step1.split()[-4:] == ["64", "32", "50.0", "%"]


def test_benchmark_refuses_a_bad_layout_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--train", "4,8"])
    assert exc.value.code == 2
    assert bench.main(["--train", "4,3,8", "--rollout-ep", "128", "--measure-world", "0"]) == 2
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("error: training EP 3")


def _check_gloo(world: int, scenarios: list, methods: list[str]) -> None:
    results = bench.run_gloo(world, scenarios, timeout_s=150)
    for i, (train, rollout, model) in enumerate(scenarios):
        for rank in range(world):
            got = results[rank][i]
            assert got["method"] == methods[i]
            want = bench.planned(train, rollout, model, rank)
            for run, meter in want.items():
                assert got[run]["ok"], f"scenario {i} rank {rank} {run}: result differs from the reference"
                assert got[run]["meter"] == {k: asdict(v) for k, v in meter.items()}, (
                    f"scenario {i} rank {rank} {run}"
                )


@pytest.mark.slow
def test_gloo_world4_bit_exact_and_bytes_as_planned():
    model8, model4 = (
        bench.tiny_spec(num_experts=8, num_layers=3),
        bench.tiny_spec(num_experts=4, num_layers=3),
    )
    scenarios = [
        (mr.TrainLayout(4, tp=1, ep=2, pp=2), mr.RolloutLayout(4, ep=4), model8),
        (mr.TrainLayout(4, tp=2, ep=2, pp=1), mr.RolloutLayout(4, ep=2), model4),
        (mr.TrainLayout(4, tp=2, ep=1, pp=2), mr.RolloutLayout(4, ep=4), model8),
    ]
    _check_gloo(4, scenarios, [mr.ALLTOALLV] * 3)


@pytest.mark.slow
def test_gloo_world8_seed_layout_and_shuffled_placement():
    model = bench.tiny_spec(num_experts=16, num_layers=3)
    scenarios = [
        (
            mr.TrainLayout(8, tp=1, ep=4, pp=2),
            mr.RolloutLayout(8, ep=8),
            model,
        ),  # the seed's EP4 PP2 -> EP8 PP1
        (mr.TrainLayout(8, tp=2, ep=4, pp=2, placement=SHUFFLED), mr.RolloutLayout(8, ep=8), model),
        (mr.TrainLayout(8, tp=2, ep=2, pp=2), mr.RolloutLayout(8, ep=4), model),
    ]
    _check_gloo(8, scenarios, [mr.ALLTOALLV] * 3)


@pytest.mark.slow
def test_gloo_non_dividing_layout_falls_back_and_stays_bit_exact():
    model = bench.tiny_spec(num_experts=6, num_layers=3)
    scenarios = [(mr.TrainLayout(6, tp=1, ep=3, pp=2), mr.RolloutLayout(6, ep=2), model)]
    _check_gloo(6, scenarios, [mr.ALLGATHER])
