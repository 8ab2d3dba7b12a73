"""Patch ds-0005: the sync vLLM rollout gives each vLLM DP rank its own chunk of the batch.

The dispatch is verl's own rule (mesh dp rank -> chunk, collect from infer_tp/infer_pp rank 0) on a row-major mesh
as init_device_mesh lays it out, with verl's real DataProto.chunk / concat; the DP groups come from patch ds-0002's
vllm_dp_env on the same tree.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

WORKERS = ("verl/workers/megatron_workers.py", "verl/workers/fsdp_workers.py")
# (world, rollout tp, vLLM dp): the recipe's real (EP128) and random (EP256) variants on 256 dies, and smaller ones
LAYOUTS = [(256, 2, 64), (256, 2, 128), (16, 2, 8), (8, 1, 4), (32, 4, 2), (8, 2, 1)]  # all > 1 engine


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    """The deepseek_r1-patched verl 0.6.0 tree (shared, read only)."""
    return patched_verl("deepseek_r1")


def _load(tree: Path, rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, tree / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mesh(patched):
    return _load(patched, "verl/utils/rollout_mesh.py", "rollout_mesh")


@pytest.fixture(scope="module")
def dp_env(patched):
    return _load(patched, "verl/utils/vllm/ascend_dp.py", "ascend_dp")


def _dispatch(shape):
    """Per global rank: (chunk index it receives, whether its output is collected), as verl registers them."""
    dp, tp, pp = shape
    coords = torch.arange(dp * tp * pp).reshape(dp, tp, pp)
    out = {}
    for d in range(dp):
        for t in range(tp):
            for p in range(pp):
                out[int(coords[d, t, p])] = (d, t == 0 and p == 0)
    return [out[r] for r in range(dp * tp * pp)]


def test_claim_holds_in_verl_060(pristine_verl, mesh):
    """0.6.0 folds vLLM DP into infer_tp: every engine of a DP group gets the group's chunk (64 copies at EP128)."""
    for rel in WORKERS:
        src = (pristine_verl / rel).read_text()
        assert re.search(
            r"infer_tp = self\.config\.rollout\.tensor_model_parallel_size \* self\.config\.rollout"
            r"\.data_parallel_size",
            src,
        )
    world, tp, dp = LAYOUTS[0]
    old = _dispatch(mesh.rollout_mesh_shape(world, tp, dp, 1, split_dp=False))
    engines = {}
    for rank, (chunk, _) in enumerate(old):
        engines.setdefault(chunk, set()).add(rank // tp)
    assert len(engines) == 2 and all(len(e) == dp for e in engines.values())


@pytest.mark.parametrize(("world", "tp", "dp"), LAYOUTS)
def test_each_engine_gets_its_own_chunk(mesh, dp_env, world, tp, dp):
    shape = mesh.rollout_mesh_shape(world, tp, dp, 1, split_dp=True)
    assert shape == (world // tp, tp, 1)
    plan = _dispatch(shape)
    by_engine = {}
    for rank, (chunk, _) in enumerate(plan):
        by_engine.setdefault(rank // tp, set()).add(chunk)
    assert all(len(c) == 1 for c in by_engine.values()), "the tp ranks of one engine must share a chunk"
    assert len({next(iter(c)) for c in by_engine.values()}) == world // tp, "two engines got the same chunk"
    assert sum(collect for _, collect in plan) == world // tp

    envs = [dp_env.vllm_dp_env(r, world, 16, tp, dp, ["h"] * world, {}) for r in range(world)]
    for group in range(world // (tp * dp)):
        ranks = range(group * tp * dp, (group + 1) * tp * dp)
        assert {envs[r]["VLLM_DP_MASTER_PORT"] for r in ranks} == {envs[ranks[0]]["VLLM_DP_MASTER_PORT"]}
        assert sorted({int(envs[r]["VLLM_DP_RANK"]) for r in ranks}) == list(range(dp))
        assert {plan[r][0] for r in ranks} == set(range(group * dp, (group + 1) * dp))


@pytest.mark.parametrize(("world", "tp", "dp"), LAYOUTS)
def test_chunks_are_equal_and_reassemble_in_order(mesh, world, tp, dp):
    from verl.protocol import DataProto

    shape = mesh.rollout_mesh_shape(world, tp, dp, 1, split_dp=True)
    engines = shape[0]
    batch = DataProto.from_dict(
        tensors={"input_ids": torch.arange(engines * 3 * 4).reshape(engines * 3, 4)},
        non_tensors={"uid": np.array([f"p{i}" for i in range(engines * 3)], dtype=object)},
    )
    chunks = batch.chunk(engines)
    assert {len(c) for c in chunks} == {3}, "vLLM DP ranks with EP step together: equal shares"
    plan = _dispatch(shape)
    collected = [chunks[chunk] for chunk, collect in plan if collect]
    merged = DataProto.concat(collected)
    assert torch.equal(merged.batch["input_ids"], batch.batch["input_ids"])
    assert list(merged.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])
    # a batch that does not divide over the engines is refused, not spread unevenly
    with pytest.raises(AssertionError, match="only support equal chunk"):
        DataProto.from_dict(tensors={"x": torch.zeros(engines * 3 + 1, 1)}).chunk(engines)


def test_unchanged_without_vllm_dp_or_split(mesh):
    for world, tp, dp in LAYOUTS:
        assert mesh.rollout_mesh_shape(world, tp, dp, 1, split_dp=False) == (world // (tp * dp), tp * dp, 1)
    assert mesh.rollout_mesh_shape(8, 2, 1, 1, split_dp=True) == mesh.rollout_mesh_shape(
        8, 2, 1, 1, split_dp=False
    )


@pytest.mark.parametrize(("world", "tp", "dp"), [(12, 4, 2), (8, 0, 1), (256, 2, 96)])
def test_refuses_a_layout_that_does_not_divide(mesh, world, tp, dp):
    with pytest.raises(ValueError, match="data_parallel_size"):
        mesh.rollout_mesh_shape(world, tp, dp, 1, split_dp=True)


@pytest.mark.parametrize("rel", WORKERS)
def test_workers_split_only_the_sync_vllm_rollout(patched, rel):
    src = (patched / rel).read_text()
    assert (
        "infer_tp = self.config.rollout.tensor_model_parallel_size * self.config.rollout.data_parallel_size"
        not in src
    )
    assert 'split_dp=self.config.rollout.name == "vllm" and self.config.rollout.mode == "sync"' in src
