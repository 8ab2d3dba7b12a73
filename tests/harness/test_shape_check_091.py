"""The DeepSeek launch built at its real shape on this CPU (python3 -m ascend_rl shape_check; verl 0.9.1, the default
base): every rank class of 61 layers at TP4 PP8 EP8 over 256 dies, built through verl 0.9.1's own engine code with
torch.distributed's fake backend and the meta device, equals the memory plan on every figure; what megatron-core
refuses is refused in its own words, by the build and by the dry run alike; a plan one layer off is caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ascend_rl import megatron_layout as ml
from ascend_rl.harness import shape_check as sc
from launcher_env import dry_run_plan, launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
DEEPSEEK = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
pytestmark = [pytest.mark.slow, pytest.mark.ci]


@pytest.fixture(scope="module")
def default_plan(e2e_python_091, pristine_base, tmp_path_factory) -> dict:
    """The DeepSeek launcher's --json dry run on its default base (0.9.1), as a user runs it."""
    tmp = tmp_path_factory.mktemp("shape")
    tree = tmp / "verl-0.9.1"
    shutil.copytree(pristine_base("0.9.1"), tree, symlinks=True)
    env = launcher_env(tmp, tree)
    env.pop("VERL_BASE")
    return dry_run_plan(run_launcher(DEEPSEEK, ["--json"], env))


def _check(plan: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "shape_check", "--plan", str(path), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_the_default_launch_builds_on_every_rank_class_and_equals_the_plan(default_plan, tmp_path):
    proc = _check(default_plan, tmp_path, "--no-cache", "--json", str(tmp_path / "report.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {(r["rank"], r["role"]): r for r in report["build"]["ranks"]}
    # the first rank of each of the 8 stages, actor (in megatron-core's DDP) and reference
    assert sorted(rows) == sorted((st * 32, role) for st in range(8) for role in ("actor", "ref"))
    assert [rows[(st * 32, "actor")]["layers"] for st in range(8)] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert rows[(0, "actor")]["embedding"] and rows[(224, "actor")]["output_layer"]
    # an 8-MoE-layer stage: 954,204,160 B dense + 22,548,578,304 B experts (bf16), megatron-core's local spec
    assert (rows[(64, "actor")]["dense_bytes"], rows[(64, "actor")]["expert_bytes"]) == (
        954204160,
        22548578304,
    )
    # the distributed optimizer's part: dense over DP 8, experts over expert-DP 4 (256 / (EP8 x PP8))
    assert {(b["kind"], b["dp"]) for b in rows[(64, "actor")]["buffers"]} == {("dense", 8), ("expert", 4)}
    assert report["differences"] == []
    assert "equal the plan's" in proc.stdout
    # the same check again is read from the cache, with the same verdict
    again = _check(default_plan, tmp_path)
    assert again.returncode == 0 and "is cached" in again.stdout, again.stdout[-2000:]


def test_without_the_split_megatron_refuses_the_launch_in_the_words_the_dry_run_uses(default_plan, tmp_path):
    plan = json.loads(json.dumps(default_plan))
    del plan["overrides"][ml.LAYOUT_KEY]
    proc = _check(plan, tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    # the build's own refusal (transformer_block.py) and the rule's, the same words, with the setting that fixes it
    assert f"AssertionError: {ml.MCORE_EVEN_SPLIT} (core/transformer/transformer_block.py:" in line, line
    assert "the dry run says: megatron-core refuses the layout: " + ml.MCORE_EVEN_SPLIT in line
    assert (
        "pipeline_model_parallel_layout='Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttL'"
        in line
    )


def test_experts_that_do_not_divide_over_ep_are_refused(default_plan, tmp_path):
    """192 dies (a stage of 24 ranks, so EP 3 fits a stage) and EP 3: 256 experts do not divide."""
    plan = json.loads(json.dumps(default_plan))
    plan["overrides"]["trainer.nnodes"] = "12"
    plan["overrides"]["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] = "3"
    proc = _check(plan, tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert "MoELayer" in line and "moe/moe_layer.py:" in line, line
    assert "256 experts do not divide over expert_model_parallel_size 3" in line


def test_a_plan_one_layer_off_is_caught_by_the_comparison(default_plan):
    """The build of the launch against a plan of the same launch with one layer moved from stage 1 to stage 2."""
    t = sc.target_from_plan(default_plan)
    result = sc.build(t, sc.rank_classes(t), jobs=2, use_cache=True, log=lambda *a: None)
    built = {key: fig for r in result["ranks"] for key, fig in sc.built_figures(t, r).items()}
    assert (
        len(built) == 256 + 8
    )  # every actor rank's figures (their optimizer parts by DP rank), 8 references
    assert sc.compare(built, sc.planned_figures(t)) == []
    moved = dict(t.settings)
    moved[ml.LAYOUT_KEY] = "Ettttttt|tttttt|ttttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttL"
    diffs = sc.compare(built, sc.planned_figures(t, settings=moved))
    assert diffs and {d.split(" (stage ")[1][0] for d in diffs} == {"1", "2"}, diffs
    assert any(d.startswith("actor rank 32 (stage 1) layers: built 7 != planned 6") for d in diffs), diffs


def test_each_fake_backend_stand_in_still_stands_in_for_what_megatron_core_does(e2e_python_091, default_plan):
    """ascend_rl/harness/fake_megatron.py's upstream facts, in the environment the build runs in: a megatron-core
    that changes under a stand-in says CHANGED here."""
    from ascend_rl import manifest

    t = sc.target_from_plan(default_plan)
    tree = sc.cpu_tree(t.recipe, t.base)
    packages = artifacts.megatron_packages(e2e_python_091, "0.9.1")
    env = dict(os.environ)
    env.update(dict(manifest.resolve_launch(t.recipe, t.base, profile="cpu").cpu_env or ()))
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(packages), str(REPO)])
    proc = subprocess.run(
        [str(e2e_python_091), "-m", "ascend_rl.harness.fake_megatron"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout)
    assert set(facts) == {
        "gloo groups on the fake store",
        "local norm and sequence parallel",
        "DDP buffers on the current device",
        "GPU initialisation and the CUDA RNG",
    }
    assert all(v.startswith("holds: ") for v in facts.values()), facts
    assert "sequence parallel not supported by torch LayerNorm" in facts["local norm and sequence parallel"]
