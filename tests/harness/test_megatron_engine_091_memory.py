"""verl 0.9.1's MegatronEngine on CPU with the memory hook on (issue 46, deliverable 5): each rank's weights,
gradients and optimizer states at its optimizer steps equal the per-die plan made for the same layout
(ascend_rl/memory_plan.py's engine path, memory_plan.megatron_engine).

The run is the step-2 driver (ascend_rl/harness/megatron_engine_091.py) as tests/harness/test_megatron_engine_091.py
launches it (2 gloo ranks, EP=2, the tiny DeepSeek-V3, megatron-core 0.16.1, Megatron-Bridge 0.3.1, the overlay's
tree, fp32: the engine config the driver builds), with ascend_rl/harness/hooks on PYTHONPATH and
RECIPES_MEMORY_RECORD set: hooks/recipes_memory_record.py wraps MegatronEngine.optimizer_step. The driver steps
twice (its update, then the checkpoint round trip's second update): every step is recorded and checked. Until
main_ppo's DeepSeek 0.9.1 CPU launch runs (issue 46 step 6), this driver run is the 0.9.1 Megatron record.
"""

from __future__ import annotations

import json

import pytest
from test_megatron_engine_091 import _tail, driver_env, prepare, run_driver

from ascend_rl import memory_plan as mp
from ascend_rl.paths import HOOK_PATH


def driver_layout() -> dict:
    """The plan's settings of the layout the driver builds (megatron_engine_091.build_engine): 2 ranks, TP1 PP1
    EP2, fp32 (cpu-0016), the distributed optimizer and verl 0.9.1's engine defaults (fp32 grad reduction:
    engine/megatron/transformer_impl.py:455-460 with no override_ddp_config)."""
    s = dict(mp.DEFAULTS)
    s.update(
        {
            "_verl": "0.9.1",
            "trainer.nnodes": 1,
            "trainer.n_gpus_per_node": 2,
            "trainer.device": "cpu",
            "actor_rollout_ref.actor.strategy": "megatron",
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 2,
            "actor_rollout_ref.actor.megatron.dtype": "float32",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        }
    )
    return s


@pytest.fixture(scope="module")
def recorded_run(e2e_python_091, pristine_base, tmp_path_factory):
    """The driver under torch.distributed.run, 2 processes, the memory hook on: (proc, records, model folder)."""
    root = tmp_path_factory.mktemp("megatron091-memory")
    tree, model, packages, work = prepare(e2e_python_091, pristine_base, root)
    record = root / "memory.jsonl"
    env = driver_env(tree, packages, *map(str, HOOK_PATH), RECIPES_MEMORY_RECORD=str(record))
    proc = run_driver(e2e_python_091, model, work, env)
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return proc, records, model


@pytest.mark.slow
@pytest.mark.full
def test_the_megatron_engines_bytes_per_rank_equal_the_plan(recorded_run):
    proc, records, model = recorded_run
    assert proc.returncode == 0, _tail(proc)
    assert records and not [r for r in records if "error" in r], records
    updates = [r for r in records if r["phase"] == "actor update"]
    print("\n" + "\n".join(json.dumps(r) for r in updates))
    # two optimizer steps per rank (the update, the round trip's second), each from the engine's Megatron path
    assert sorted(r["rank"] for r in updates) == [0, 0, 1, 1], updates
    assert {r["strategy"] for r in updates} == {"megatron"}
    cfg, _ = mp.model_config(str(model))
    plan = mp.plan(driver_layout(), cfg, mp.DIES["A3"])
    assert mp.megatron_engine(driver_layout())
    for r in updates:
        planned = mp.measured_terms(plan, rank=r["rank"])
        measured = {k: r[k] for k in ("weights", "gradients", "optimizer_states")}
        assert measured == {k: planned[k] for k in measured}, (r, planned)
        # fp32 weights: the distributed optimizer's main weights are views of the param buffer, nothing of their own
        assert r["main_params"] == 0, r
