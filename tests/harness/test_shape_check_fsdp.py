"""The shape check of the Qwen2.5-1.5B launches on verl 0.9.1 (FSDP engine): every rank built by verl's own
apply_fsdp2 on the meta device with the fake process group, each rank's bytes compared with memory_plan's.

The launchers' default actor is FSDP1 (actor.strategy=fsdp), which the check does not build: it says so. With
actor.strategy=fsdp2 their one-card and four-card layouts are built, and a three-card one whose dims the world does
not divide (the vocabulary, the KV projections: the last rank's local shard is smaller than the stored one)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher_env import dry_run_plan, launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5"
pytestmark = [pytest.mark.slow, pytest.mark.full]
FSDP2 = "actor_rollout_ref.actor.strategy=fsdp2"


@pytest.fixture(scope="module")
def plans(e2e_python_091, pristine_base, tmp_path_factory) -> dict:
    """The Qwen launchers' --json dry runs on their default base (0.9.1), as a user runs them."""
    tmp = tmp_path_factory.mktemp("shape-fsdp")
    tree = tmp / "verl-0.9.1"
    shutil.copytree(pristine_base("0.9.1"), tree, symlinks=True)
    env = launcher_env(tmp, tree)
    env.pop("VERL_BASE")
    single, multi = QWEN / "run_qwen2_5_1_5b_single.sh", QWEN / "run_qwen2_5_1_5b.sh"
    small = ["data.train_batch_size=48", "actor_rollout_ref.actor.ppo_mini_batch_size=12"]
    return {
        "default-4": dry_run_plan(run_launcher(multi, ["--json"], dict(env, NPUS="4"))),
        "1": dry_run_plan(run_launcher(single, ["--json", FSDP2], env)),
        "4": dry_run_plan(run_launcher(multi, ["--json", FSDP2], dict(env, NPUS="4"))),
        "3": dry_run_plan(run_launcher(multi, ["--json", FSDP2, *small], dict(env, NPUS="3"))),
    }


def _check(plan: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "shape_check", "--plan", str(path), *args],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip


def test_the_default_fsdp1_launch_is_refused_in_one_line(plans, tmp_path):
    proc = _check(plans["default-4"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "shape_check: error: the launch's actor is FSDP1 (actor.strategy=fsdp: verl's engine wraps it in "
        "FullyShardedDataParallel's flat parameters), which the check does not build; it builds FSDP2 "
        "(actor_rollout_ref.actor.strategy=fsdp2) and Megatron launches"
    ], proc.stderr


# Qwen2.5-1.5B: 1,543,714,304 parameters (tied embedding); per rank the stored shard, padded to rank 0's rows,
# and the last rank's unpadded local shard
@pytest.mark.parametrize(
    ("world", "stored", "last_local"),
    [(1, 1543714304, 1543714304), (4, 385928576, 385928576), (3, 514658512, 514397280)],
)
def test_every_fsdp2_rank_builds_and_equals_the_plan(world, stored, last_local, plans, tmp_path):
    report_path = tmp_path / "report.json"
    proc = _check(plans[str(world)], tmp_path, "--no-cache", "--json", str(report_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    rows = sorted(report["build"]["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == list(range(world))
    assert {r["stored"] for r in rows} == {stored}
    assert rows[-1]["local"] == last_local
    assert {r["element_size"] for r in rows} == {4}  # fsdp_config.model_dtype=fp32
    assert report["differences"] == []
    assert "equal the plan's" in proc.stdout
