"""The shape check on verl 0.7.1 and 0.6.0 (issue 57): the DeepSeek launch's every rank class built through the base's
own model-building path -- verl's Megatron worker with use_mbridge=False: hf_to_mcore_config, then get_model with
init_mcore_model, megatron-core 0.12.1 (constraints.txt) -- in the e2e environment (.venv-e2e, torch 2.9.1), with
torch.distributed's fake backend at the launch's 128 ranks and the meta device (ascend_rl/harness/fake_ranks.py),
and every figure equal to the memory plan's (ascend_rl/memory_plan.py, megatron-core 0.12.1's buffer padding).

The negative control: the same launch without its pipeline split (the plan's overrides less the two
num_layers_in_*_pipeline_stage keys) is refused by megatron-core 0.12.1 itself, in its own words, at its own line
(transformer_block.py:115; 0.16.1 says it at :156).

Also: the upstream facts the 0.12.1 stand-ins of ascend_rl/harness/fake_megatron.py rest on, so that a megatron-core
or torch that changes under a stand-in fails here rather than building something else silently.

Full tier (make test-full): it needs the e2e environment, and each base builds 16 ranks (about a minute on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ascend_rl.harness import shape_check
from ascend_rl.harness.launch import DS_LAUNCHER

pytestmark = [pytest.mark.slow, pytest.mark.full]

REPO = Path(__file__).resolve().parents[2]
SPLIT = [7, 8, 8, 8, 8, 8, 8, 6]  # recipe.toml's first 7 / last 6 over PP 8
SPLIT_KEYS = (
    "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage",
    "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage",
)


@pytest.fixture(scope="module")
def worker_env(e2e_python) -> Path:
    """The e2e environment the worker bases build in (setup_e2e.sh makes it and the .venv-e2e link)."""
    python = REPO / ".venv-e2e" / "bin" / "python"
    assert python.is_file(), f"setup_e2e.sh ran ({e2e_python}) but {python} is missing"
    return python


def launch_plan(base: str, tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    """The default DeepSeek launch's dry-run plan on `base` (the launcher's --json), less the overrides `drop`."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(DS_LAUNCHER), "--json", "--base", base],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    for key in drop:
        assert key in plan["overrides"], f"the launch on {base} no longer sets {key}"
        del plan["overrides"][key]
    path = tmp_path / f"plan-{base}.json"
    path.write_text(json.dumps(plan))
    return path


def check(plan: Path, tmp_path: Path, capsys) -> tuple[int, dict, str]:
    """shape_check --plan, built afresh (--no-cache): its exit status, JSON report and printed output."""
    report = tmp_path / "report.json"
    status = shape_check.main(["--plan", str(plan), "--jobs", "2", "--no-cache", "--json", str(report)])
    out = capsys.readouterr()
    return status, (json.loads(report.read_text()) if report.is_file() else {}), out.out + out.err


@pytest.mark.parametrize("base", ["0.7.1", "0.6.0"])
def test_default_launch_builds_and_equals_the_plan(base, worker_env, tmp_path, capsys):
    plan = launch_plan(base, tmp_path)
    settings = shape_check.target_from_plan(json.loads(plan.read_text())).settings
    world = int(settings["trainer.nnodes"]) * int(settings["trainer.n_gpus_per_node"])
    meg = {k: int(settings[shape_check.MEG + k]) for k in ("tensor_model_parallel_size",
           "pipeline_model_parallel_size", "expert_model_parallel_size")}  # fmt: skip
    tp, pp, ep = meg.values()
    assert (world, tp, pp, ep) == (256, 4, 8, 8)  # the recipe's 16 nodes of 16 dies
    status, report, text = check(plan, tmp_path, capsys)
    print(text)
    assert status == 0, text
    build = report["build"]
    assert build["megatron_core"] == "0.12.1", build.get("megatron_core")
    ranks = build["ranks"]
    assert not [r for r in ranks if "error" in r], text
    # every rank class: the first rank of each of the 8 stages, as the actor and as the reference
    assert sorted((r["role"], r["rank"]) for r in ranks) == sorted(
        (role, stage * world // pp) for role in ("actor", "ref") for stage in range(pp)
    )
    for role in ("actor", "ref"):
        rows = sorted((r for r in ranks if r["role"] == role), key=lambda r: r["rank"])
        assert [r["layers"] for r in rows] == SPLIT
        assert rows[0]["embedding"] and not rows[0]["output_layer"]
        assert rows[-1]["output_layer"] and not rows[-1]["embedding"]
        assert rows[-1]["layer_numbers"] == list(range(56, 62))
    # the actor in megatron-core 0.12.1's DDP: bf16 buffers (grad_reduce_in_fp32=False) over the data-parallel
    # groups (dense: 256 / (TP 4 x PP 8) = 8, expert: 256 / (EP 8 x PP 8) = 4); their bytes, padding and the
    # distributed optimizer's part are the plan's (report["differences"])
    for row in (r for r in ranks if r["role"] == "actor"):
        assert {(b["kind"], b["dp"], b["param_dtype"], b["grad_dtype"]) for b in row["buffers"]} == {
            ("dense", world // (tp * pp), "bfloat16", "bfloat16"),
            ("expert", world // (ep * pp), "bfloat16", "bfloat16"),
        }
    assert report["differences"] == []
    assert "equal the plan's" in text


@pytest.mark.parametrize("base", ["0.7.1", "0.6.0"])
def test_launch_without_split_is_refused_by_megatron_core_012(base, worker_env, tmp_path, capsys):
    status, report, text = check(launch_plan(base, tmp_path, drop=SPLIT_KEYS), tmp_path, capsys)
    print(text)
    assert status == 1, text
    assert report["build"]["megatron_core"] == "0.12.1"
    assert (
        report["refused"] == "AssertionError: num_layers should be divisible by pipeline_model_parallel_size"
    )
    (row,) = report["build"]["ranks"]
    assert row["where"] == "core/transformer/transformer_block.py:115", row  # megatron-core 0.12.1's line
    # the setting that fixes it, as the dry run names it for a base without the layout string
    assert "set num_layers_in_first_pipeline_stage=7 num_layers_in_last_pipeline_stage=6" in text


# what each 0.12.1 stand-in of fake_megatron.py stands in for, asked of the e2e environment's torch and megatron-core
UPSTREAM_FACTS = r"""
import inspect, json
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.package_info import __version__

facts = {"version": __version__}
# initialize_model_parallel(create_gloo_process_groups=False): 0.12.1 has the switch (parallel_state.py:450)
facts["gloo_switch"] = "create_gloo_process_groups" in inspect.signature(
    parallel_state.initialize_model_parallel).parameters
# DDP.broadcast_params broadcasts every parameter (distributed_data_parallel.py:503-520) ...
facts["broadcasts"] = "torch.distributed.broadcast(" in inspect.getsource(DistributedDataParallel.broadcast_params)
# ... and c10d's broadcast has no meta kernel under the fake backend
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
try:
    dist.broadcast(torch.empty(4, device="meta"), src=0)
    facts["meta_broadcast"] = "ran"
except NotImplementedError as exc:
    facts["meta_broadcast"] = "Meta tensors" in str(exc)
# a module on the meta device cannot be moved to the CPU (what verl's get_model / model provider do)
try:
    torch.nn.Linear(2, 2, device="meta").to("cpu")
    facts["meta_to_cpu"] = "ran"
except NotImplementedError as exc:
    facts["meta_to_cpu"] = "Cannot copy out of meta tensor" in str(exc)
print(json.dumps(facts))
"""


def test_the_012_stand_ins_upstream_facts(worker_env):
    packages = artifacts.megatron_packages(worker_env, None)
    env = dict(os.environ, PYTHONPATH=str(packages))
    proc = subprocess.run(
        [str(worker_env), "-c", UPSTREAM_FACTS], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts == {
        "version": "0.12.1",
        "gloo_switch": True,
        "broadcasts": True,
        "meta_broadcast": True,
        "meta_to_cpu": True,
    }, facts
