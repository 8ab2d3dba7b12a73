"""Explicit offload in verl 0.7.1's server rollout (patch ds-0104), run from the patched tree on CPU tensors.

The engine model is test_deepseek_weight_sync's DeepSeek-shaped layer, laid out by vllm-ascend 0.13.0's own
post-load code taken from the wheel (fused-MoE transposes, MLA W_UV / W_UK_T). The worker extension's new methods,
ServerAdapter.resume/release and vLLMHttpServer.sleep are compiled from the patched 0.7.1 files and called with
stand-ins for what they talk to (the engine's collective_rpc, the model runner); the RolloutConfig check runs in a
subprocess with the tree first on PYTHONPATH.
"""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from test_deepseek_weight_sync import _compiled, _load, build_model, upstream  # noqa: F401 - upstream: a fixture

REPO = Path(__file__).resolve().parents[2]
OURS = [
    "llm_rl/deepseek_r1/patches/ds-0103-vllm-additional-config-071.patch",
    "llm_rl/deepseek_r1/patches/ds-0104-npu-explicit-offload-071.patch",
    "llm_rl/deepseek_r1/patches/ds-0108-vllm-ascend-weight-sync-071.patch",
]
UTILS = "verl/workers/rollout/vllm_rollout/utils.py"


def patched_071(pristine: Path, dest: Path) -> Path:
    """verl 0.7.1 with the recipe's 0.7.1 series (which lists OURS)."""
    from ascend_rl import overlay

    shutil.copytree(pristine, dest, symlinks=True)
    recipe = overlay.load_recipe("deepseek_r1", "0.7.1")
    assert all(any(str(s).endswith(patch) for s in recipe.series) for patch in OURS), recipe.series
    overlay.apply_series(recipe, dest)
    return dest


def method(tree: Path, path: str, qualname: str) -> ast.AsyncFunctionDef | ast.FunctionDef:
    body = ast.parse((tree / path).read_text()).body
    cls, name = qualname.split(".")
    klass = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(
        n for n in klass.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory, pristine_base) -> Path:
    return patched_071(pristine_base("0.7.1"), tmp_path_factory.mktemp("ds071") / "verl")


@pytest.fixture(scope="module")
def offload_mod(tree):
    """The module ds-0104 installs, imported from the repository (test_installs.py: the tree holds these bytes)."""
    from llm_rl.deepseek_r1.verl_modules import explicit_offload

    return explicit_offload


def _runner(model, blocks: int = 3):
    """A model runner as the extension sees it: the model, kv_caches, and layers bound to them in the context."""
    kv = [torch.randn(2, blocks, 4, 8)]
    layer = types.SimpleNamespace(kv_cache=[kv[0]])
    config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(static_forward_context={"l0": layer})
    )
    return types.SimpleNamespace(model=model, kv_caches=kv, vllm_config=config)


def _extension(tree, offload_mod, monkeypatch, runner):
    """An object with the patched extension's offload_engine / onload_engine / _explicit_offload bound to it."""
    monkeypatch.setitem(sys.modules, "verl.utils.explicit_offload", offload_mod)
    cls = type("Worker", (), {})
    for name in ("offload_engine", "onload_engine", "_explicit_offload"):
        setattr(cls, name, _compiled(method(tree, UTILS, f"vLLMColocateWorkerExtension.{name}"), {}, UTILS))
    worker = cls()
    worker.model_runner = runner
    return worker


def assert_offload_onload_by_tag(worker, model, kv: torch.Tensor, bound) -> dict[str, int]:
    """The extension's offload_engine frees every weight, derived and KV-cache storage (a second call does nothing);
    onload_engine brings back the weights bit for bit, then the KV cache zeroed, each only with its own tag, in the
    same tensors. bound(): the tensor the attention layer holds as its KV cache. Returns what was freed."""
    impl = model.model.layers[0].self_attn.mla_attn.impl
    weights = {**dict(model.named_parameters()), "W_UV": impl.W_UV, "W_UK_T": impl.W_UK_T}
    before = {k: v.clone() for k, v in weights.items()}

    freed = worker.offload_engine()
    print("offload_engine freed", freed)
    assert freed["weights"] == sum(v.untyped_storage().nbytes() for v in before.values())
    assert freed["kv_cache"] == kv.numel() * kv.element_size()
    assert all(v.untyped_storage().nbytes() == 0 for v in weights.values()), "a weight kept its device memory"
    assert kv.untyped_storage().nbytes() == 0 and bound() is kv
    assert worker.offload_engine() == {"kv_cache": 0, "weights": 0}, "a second release must be a no-op"

    assert worker.onload_engine(["weights"])["weights"] == freed["weights"]
    assert kv.untyped_storage().nbytes() == 0, "the KV cache comes back only with its own tag"
    for name, tensor in weights.items():
        assert torch.equal(tensor, before[name]), f"{name} not restored bit for bit"
    assert impl.W_UV is weights["W_UV"], "the derived tensors stay the objects the backend holds"
    assert worker.onload_engine(["kv_cache"]) == {"kv_cache": freed["kv_cache"]}
    assert not kv.any() and bound() is kv, "the KV cache is re-created, zeroed, in the same tensor"
    return freed


def test_offload_engine_frees_and_onload_engine_restores_by_tag(upstream, tree, offload_mod, monkeypatch):  # noqa: F811
    model = build_model(upstream)
    runner = _runner(model)
    kv = runner.kv_caches[0]
    worker = _extension(tree, offload_mod, monkeypatch, runner)
    layer = runner.vllm_config.compilation_config.static_forward_context["l0"]
    assert_offload_onload_by_tag(worker, model, kv, lambda: layer.kv_cache[0])
    assert kv.shape == (2, 3, 4, 8)


def _call(fn, self, *args, **kwargs):
    return asyncio.run(fn(self, *args, **kwargs))


def test_server_adapter_and_http_server_route_by_the_key(tree):
    rollout = "verl/workers/rollout/vllm_rollout/vllm_rollout.py"
    resume = _compiled(method(tree, rollout, "ServerAdapter.resume"), {}, rollout)
    release = _compiled(method(tree, rollout, "ServerAdapter.release"), {}, rollout)
    calls = []

    async def execute(method, **kwargs):
        calls.append((method, kwargs.get("kwargs")))

    for explicit, expected in ((True, ["onload_engine", "offload_engine"]), (False, ["wake_up", "sleep"])):
        calls.clear()
        adapter = types.SimpleNamespace(
            config=types.SimpleNamespace(free_cache_engine=True, explicit_offload=explicit),
            sleep_level=2,
            _execute_method=execute,
        )
        _call(resume, adapter, tags=["weights"])
        _call(release, adapter)
        assert [c[0] for c in calls] == expected, (explicit, calls)
        assert calls[0][1] == {"tags": ["weights"]}

    server_py = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"
    mode = types.SimpleNamespace(HYBRID="hybrid", COLOCATED="colocated", STANDALONE="standalone")
    sleep = _compiled(
        method(tree, server_py, "vLLMHttpServer.sleep"), {"RolloutMode": mode, "logger": None}, server_py
    )
    for explicit, expected in ((True, ("offload_engine", None)), (False, ("sleep", {"level": 2}))):
        rpcs = []

        async def collective_rpc(name, kwargs=None, rpcs=rpcs):
            rpcs.append((name, kwargs))

        server = types.SimpleNamespace(
            node_rank=0,
            rollout_mode="hybrid",
            lora_as_adapter=False,
            config=types.SimpleNamespace(free_cache_engine=True, explicit_offload=explicit),
            engine=types.SimpleNamespace(collective_rpc=collective_rpc),
        )
        _call(sleep, server)
        assert rpcs == [expected], (explicit, rpcs)


def test_rollout_config_refuses_the_key_with_graphs_or_sleep_mode(tree):
    script = """
from verl.workers.config.rollout import RolloutConfig
ok = RolloutConfig(name="vllm", explicit_offload=True, enforce_eager=True, enable_sleep_mode=False)
assert ok.explicit_offload and not RolloutConfig(name="vllm").explicit_offload
for bad in ({"enforce_eager": False, "enable_sleep_mode": False}, {"enforce_eager": True}):
    try:
        RolloutConfig(name="vllm", explicit_offload=True, **bad)
    except ValueError as exc:
        print("refused:", exc)
    else:
        raise SystemExit(f"accepted {bad}")
"""
    env = {**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("refused: rollout.explicit_offload needs") == 2, proc.stdout


def test_the_key_composes_off_by_default(tree):
    from ascend_rl import preflight

    base = ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]
    cfg = preflight.compose(tree, "ppo_megatron_trainer", base)
    assert cfg.actor_rollout_ref.rollout.explicit_offload is False
    cfg = preflight.compose(
        tree, "ppo_megatron_trainer", [*base, "actor_rollout_ref.rollout.explicit_offload=True"]
    )
    assert cfg.actor_rollout_ref.rollout.explicit_offload is True
