"""Explicit offload in verl 0.9.1's server rollout (patch ds-0204, with ds-0208), run from the patched tree on CPU.

One weight-sync cycle as verl 0.9.1 runs it, every step of it real code except the transports: the trainer's
sleep_replicas reaches ServerAdapter.release -> vLLMHttpServer.sleep, and ActorRolloutRefWorker.update_weights
(resume "weights", the sync, the actor's offload, resume "kv_cache") reaches vLLMHttpServer.wake_up, all compiled
from the patched tree's files; the server's engine calls go through vLLM 0.23.0's own AsyncLLM, AsyncMPClient /
DPLBAsyncMPClient, EngineCore and Executor bodies (compiled from the wheel) to two DP engines of one worker each,
whose extension methods are the tree's and whose wake_up is vllm-ascend 0.23.0.post1's NPUWorker.wake_up (sdist).
Stood in for: Ray's remote calls and vLLM's ZMQ (a direct call), the bucket transport (test_mla_sync_091's
receiver, the same buckets to both engines), the schedulers (pause / resume recorded) and the CPU workers' own
sleep (recorded; vLLM's CPU platform has no sleep mode). The RolloutConfig check runs in a subprocess with the tree
first on PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import types

import pytest
import torch
from test_deepseek_weight_sync import _compiled, assert_engine_holds, trainer_weights
from test_explicit_offload_071 import assert_offload_onload_by_tag, method
from test_mla_sync_091 import bare, build_model_023, make_worker, trees, two_buckets, upstream_023  # noqa: F401
from test_vllm_ascend_contract import function
from test_vllm_ascend_contract_023 import CORE, CORE_CLIENT, function_async, vllm_023_path

SERVER = "verl/workers/rollout/vllm_rollout/vllm_async_server.py"
ROLLOUT = "verl/workers/rollout/vllm_rollout/vllm_rollout.py"
ENGINE_WORKERS = "verl/workers/engine_workers.py"
ASYNC_LLM = "vllm/v1/engine/async_llm.py"
EXECUTOR = "vllm/v1/executor/abstract.py"
DP = 2  # DP engines behind the server's one client
MODE = types.SimpleNamespace(HYBRID="hybrid", COLOCATED="colocated", STANDALONE="standalone")


def _noop(*_, **__):
    return None


@pytest.fixture(scope="module")
def vllm_engine():
    """vLLM 0.23.0's classes the server's engine calls pass through, with their bodies from the wheel."""
    wheel = vllm_023_path()

    def compiled(path, qual, ns, is_async=True):
        fn = function_async(wheel, path, qual) if is_async else function(wheel, path, qual)
        return _compiled(bare(fn), {"asyncio": asyncio, **ns}, path)

    llm = type(
        "AsyncLLM",
        (),
        {
            name: compiled(ASYNC_LLM, f"AsyncLLM.{name}", {})
            for name in ("collective_rpc", "sleep", "wake_up", "reset_prefix_cache", "reset_encoder_cache")
        },
    )
    client_methods = {
        name: compiled(CORE_CLIENT, f"AsyncMPClient.{name}", {})
        for name in (
            "collective_rpc_async",
            "sleep_async",
            "wake_up_async",
            "reset_prefix_cache_async",
            "reset_encoder_cache_async",
        )
    }
    one_engine = compiled(CORE_CLIENT, "AsyncMPClient.call_utility_async", {})
    fan_out = compiled(CORE_CLIENT, "DPLBAsyncMPClient.call_utility_async", {})
    core = {
        name: compiled(CORE, f"EngineCore.{name}", {}, is_async=False)
        for name in ("sleep", "wake_up", "collective_rpc")
    }
    log = types.SimpleNamespace(info=_noop, warning=_noop)
    executor = {
        name: compiled(EXECUTOR, f"Executor.{name}", {"logger": log, "time": time}, is_async=False)
        for name in ("sleep", "wake_up")
    }
    return types.SimpleNamespace(
        llm=llm,
        client_methods=client_methods,
        one_engine=one_engine,
        fan_out=fan_out,
        core=core,
        executor=executor,
    )


class Executor:
    """One DP engine's executor: vLLM's sleep / wake_up bodies over a collective_rpc to its workers by name."""

    def __init__(self, workers, log):
        self.workers, self.log, self.is_sleeping, self.sleeping_tags = workers, log, False, set()

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]


def engine_stack(up, vllm_engine, workers_per_engine, *, fan_out=True):
    """The server's AsyncLLM over DP engine cores, each with its executor and workers; returns (engine, log)."""
    log: list[tuple] = []
    cores = []
    for index, workers in enumerate(workers_per_engine):
        executor_cls = type("Exec", (Executor,), dict(vllm_engine.executor))
        core_cls = type(
            "EngineCore",
            (),
            {
                **vllm_engine.core,
                "pause_scheduler": lambda self, mode="abort", clear_cache=True: log.append(
                    ("pause", self.index, clear_cache)
                ),
                "resume_scheduler": lambda self: log.append(("resume", self.index)),
                "reset_prefix_cache": lambda self, *a: log.append(("reset_prefix_cache", self.index)),
                "reset_encoder_cache": lambda self: None,
            },
        )
        core = core_cls()
        core.index, core.model_executor = index, executor_cls(workers, log)
        for worker in workers:  # what reaches the workers, in order
            for name in ("offload_engine", "onload_engine", "update_weights_from_ipc", "wake_up", "sleep"):
                if hasattr(worker, name):
                    setattr(worker, name, _recorded(getattr(worker, name), log, name, index))
                else:
                    setattr(worker, name, _recorded(_noop, log, name, index))  # CPU: no sleep mode
        cores.append(core)

    async def call_engine(
        self, method, *args, engine
    ):  # the utility call over ZMQ, run in the engine's process
        return getattr(engine, method)(*args)

    client_cls = type(
        "Client",
        (),
        {
            **vllm_engine.client_methods,
            "_call_utility_async": call_engine,
            "call_utility_async": vllm_engine.fan_out if fan_out else vllm_engine.one_engine,
        },
    )
    client = client_cls()
    client.core_engines, client.core_engine = cores, cores[0]

    async def clear_mm_cache_async():
        return None

    engine = vllm_engine.llm()
    engine.engine_core, engine.logger_manager = client, None
    engine.renderer = types.SimpleNamespace(clear_mm_cache_async=clear_mm_cache_async)
    return engine, log


def _recorded(fn, log, name, index):
    def call(*args, **kwargs):
        log.append((name, index, kwargs.get("tags") if name in ("onload_engine", "wake_up") else None))
        return fn(*args, **kwargs)

    return call


def server_and_rollout(tree, engine, explicit: bool | None):
    """vLLMHttpServer (node 0, hybrid) and ServerAdapter as the tree has them, and a rollout.update_weights that
    hands the trainer's buckets to every worker through the server's collective_rpc."""
    server_ns = {
        "RolloutMode": MODE,
        "logger": types.SimpleNamespace(info=_noop),
        "is_torch_npu_available": lambda check_device=True: True,  # as on an NPU: sleep level 1
    }
    names = (
        "sleep",
        "wake_up",
        "_sleep_hybrid",
        "_resolve_sleep_level",
        "_get_wake_up_tags",
        "collective_rpc",
    )
    server_cls = type(
        "Server",
        (),
        {n: _compiled(bare(method(tree, SERVER, f"vLLMHttpServer.{n}")), server_ns, SERVER) for n in names},
    )
    config = types.SimpleNamespace(free_cache_engine=True, mtp=None)
    if explicit is not None:  # None: a tree without ds-0204, whose config has no such key
        config.explicit_offload = explicit
    server = server_cls()
    server.node_rank, server.rollout_mode, server.lora_as_adapter, server.config = 0, "hybrid", False, config
    server.engine = engine

    class Remote:
        def __init__(self, fn):
            self.remote = fn

    adapter_cls = type(
        "Adapter",
        (),
        {
            n: _compiled(bare(method(tree, ROLLOUT, f"ServerAdapter.{n}")), {}, ROLLOUT)
            for n in ("resume", "release")
        },
    )
    adapter = adapter_cls()
    adapter.config, adapter._ensure_server_handle = config, lambda: True
    adapter.server_handle = types.SimpleNamespace(wake_up=Remote(server.wake_up), sleep=Remote(server.sleep))
    adapter.sleep_level = 1

    async def update_weights(weights, peft_config=None, base_sync_done=False, global_steps=None):
        two_buckets(dict(weights))
        kwargs = {"peft_config": peft_config, "base_sync_done": base_sync_done, "use_shm": False}
        await server.collective_rpc("update_weights_from_ipc", kwargs=kwargs)

    adapter.update_weights = update_weights
    return server, adapter


def actor_update_weights(tree, rollout, weights: dict):
    """ActorRolloutRefWorker.update_weights of the tree, for the colocated (naive) sync, on this rollout."""
    ns = {
        "asyncio": asyncio,
        "torch": types.SimpleNamespace(distributed=types.SimpleNamespace(barrier=_noop)),
        "set_expandable_segments": _noop,
        "get_torch_device": lambda: types.SimpleNamespace(empty_cache=_noop, synchronize=_noop),
        "log_gpu_memory_usage": _noop,
        "logger": None,
    }
    fn = _compiled(
        bare(method(tree, ENGINE_WORKERS, "ActorRolloutRefWorker.update_weights")), ns, ENGINE_WORKERS
    )
    rollout_config = {"free_cache_engine": True, "name": "vllm"}
    worker = types.SimpleNamespace(
        config=types.SimpleNamespace(
            rollout=types.SimpleNamespace(
                get=rollout_config.get,
                free_cache_engine=True,
                checkpoint_engine=types.SimpleNamespace(backend="naive"),
            )
        ),
        actor=types.SimpleNamespace(
            engine=types.SimpleNamespace(
                get_per_tensor_param=lambda **_: (iter(weights.items()), None), is_param_offload_enabled=False
            )
        ),
        rollout=rollout,
        layered_summon=False,
        peft_merge=False,
        base_sync_done=False,
    )
    asyncio.run(fn(worker, global_steps=1))


def engine_storages(worker) -> list[torch.Tensor]:
    """Every tensor ds-0204 frees: the model's parameters, buffers, derived attention tensors and the KV cache."""
    from llm_rl.deepseek_r1.verl_modules import explicit_offload

    runner = worker.model_runner
    return [*explicit_offload.weight_tensors(runner.model), *explicit_offload.kv_cache_tensors(runner)]


def freed(worker) -> bool:
    return all(t.untyped_storage().nbytes() == 0 for t in engine_storages(worker))


def cycle(up, tree, vllm_engine, monkeypatch, *, explicit=True, fan_out=True, steps=2):
    """Engines built, then `steps` times: release (the end of a rollout), update_weights with the trainer's weights.
    Returns (workers, models, log, per-step snapshots)."""
    models = [build_model_023(up) for _ in range(DP)]
    workers = [make_worker(tree, model, up, monkeypatch) for model in models]
    engine, log = engine_stack(up, vllm_engine, [[w] for w in workers], fan_out=fan_out)
    server, adapter = server_and_rollout(tree, engine, explicit)
    snapshots = []
    for step in range(1, steps + 1):
        before = [{k: v.clone() for k, v in m.named_parameters()} for m in models]
        log.append(("-- release", step))
        asyncio.run(adapter.release())
        released = [freed(w) for w in workers]
        weights = trainer_weights(100 + step)
        log.append(("-- update_weights", step))
        actor_update_weights(tree, adapter, weights)
        snapshots.append({"released": released, "before": before, "weights": weights})
    return workers, models, log, snapshots


def test_offload_engine_frees_and_onload_engine_restores_by_tag(upstream_023, trees, monkeypatch):  # noqa: F811
    model = build_model_023(upstream_023)
    worker = make_worker(trees["full"], model, upstream_023, monkeypatch)
    kv = worker.model_runner.kv_caches[0]
    layer = worker.model_runner.vllm_config.compilation_config.static_forward_context[
        "model.layers.0.self_attn.attn"
    ]
    worker.offload_engine = _checked(worker.offload_engine, lambda: freed(worker))
    assert_offload_onload_by_tag(worker, model, kv, lambda: layer.kv_cache)


def _checked(offload, all_freed):
    """offload_engine, then a check that every storage engine_storages lists is freed (derived and KV included)."""

    def call():
        got = offload()
        assert all_freed(), "a storage of the engine kept its memory"
        return got

    return call


def test_the_sync_cycle_frees_every_dp_engine_and_ends_with_the_trainers_weights(
    upstream_023,  # noqa: F811
    trees,  # noqa: F811
    vllm_engine,
    monkeypatch,
):
    workers, models, log, snapshots = cycle(upstream_023, trees["full"], vllm_engine, monkeypatch)
    for step, snap in enumerate(snapshots, 1):
        assert snap["released"] == [True] * DP, f"step {step}: release left storages on a DP engine"
    for model in models:
        assert_engine_holds(upstream_023, model, snapshots[-1]["weights"])
    for worker in workers:
        kv = worker.model_runner.kv_caches[0]
        assert kv.untyped_storage().nbytes() == kv.numel() * kv.element_size() and not kv.any()
    # the order on every DP engine, per step: scheduler paused (level-0 sleep: the prefix cache stays), offload,
    # onload the weights, the sync, onload the KV cache, then the scheduler resumes through a wake_up that reaches
    # no worker; NPUWorker.wake_up (0.23's transpose) and the workers' sleep are never called
    for index in range(DP):
        mine = [e for e in log if e[0].startswith("--") or (len(e) > 1 and e[1] == index)]
        step_log = [
            e[0] if e[0] != "onload_engine" else f"onload_engine{e[2]}" for e in mine if e[0] != "-- release"
        ]
        expected = [
            "pause",
            "offload_engine",
            "-- update_weights",
            "onload_engine['weights']",
            "reset_prefix_cache",
            "update_weights_from_ipc",
            "onload_engine['kv_cache']",
            "resume",
            "reset_prefix_cache",
        ]
        assert step_log == expected * 2, (index, step_log)
        assert ("pause", index, False) in log
    assert not [e for e in log if e[0] in ("wake_up", "sleep")], "a worker's sleep / wake_up ran"
    print(
        "ds-0204 cycle x2 on", DP, "DP engines:", [e for e in log if e[1] == 0 or e[0].startswith("--")][:12]
    )


def test_the_weights_are_onloaded_bit_for_bit_before_the_sync(upstream_023, trees, vllm_engine, monkeypatch):  # noqa: F811
    """Between the weights' onload and the sync, each engine holds exactly what it held before the release."""
    seen = []
    models = [build_model_023(upstream_023) for _ in range(DP)]
    workers = [make_worker(trees["full"], m, upstream_023, monkeypatch) for m in models]
    for worker in workers:
        sync = worker.update_weights_from_ipc

        def check_then_sync(*a, _worker=worker, _sync=sync, **k):
            model = _worker.model_runner.model
            seen.append(all(torch.equal(p, _worker.expected[n]) for n, p in model.named_parameters()))
            return _sync(*a, **k)

        worker.update_weights_from_ipc = check_then_sync
    engine, _ = engine_stack(upstream_023, vllm_engine, [[w] for w in workers])
    server, adapter = server_and_rollout(trees["full"], engine, explicit=True)
    for step in (1, 2):
        for worker, model in zip(workers, models, strict=True):
            worker.expected = {n: p.clone() for n, p in model.named_parameters()}
        asyncio.run(adapter.release())
        assert all(freed(w) for w in workers)
        actor_update_weights(trees["full"], adapter, trainer_weights(200 + step))
    assert seen == [True] * (2 * DP), seen


def test_one_engine_client_would_leave_the_other_dp_engines_weights(
    upstream_023,  # noqa: F811
    trees,  # noqa: F811
    vllm_engine,
    monkeypatch,
):
    """Why ds-0204 relies on the DP client's fan-out: with AsyncMPClient's call_utility_async (one engine) in place
    of DPLBAsyncMPClient's, the release frees engine 0 only."""
    _, _, _, snapshots = cycle(upstream_023, trees["full"], vllm_engine, monkeypatch, fan_out=False, steps=1)
    assert snapshots[0]["released"] == [True] + [False] * (DP - 1)


def test_the_unpatched_091_cycle_frees_nothing_here(upstream_023, trees, vllm_engine, monkeypatch):  # noqa: F811
    """Negative control: the series without ds-0204 / ds-0208 sleeps at level 1 (forced on an NPU), which on CPU
    frees no storage (on an NPU CaMemAllocator would, and vllm-ascend's wake_up transposes the experts back)."""
    workers, models, log, snapshots = cycle(
        upstream_023, trees["no-0204"], vllm_engine, monkeypatch, explicit=None, steps=1
    )
    assert snapshots[0]["released"] == [False] * DP
    with pytest.raises(AssertionError):
        assert snapshots[0]["released"] == [True] * DP
    assert ("sleep", 0, None) in log and (
        "wake_up",
        0,
        ["weights"],
    ) in log  # sleep level 1, then 0.23's wake_up
    for model in models:  # the sync itself works after wake_up (it put the experts into the loader layout)
        assert_engine_holds(upstream_023, model, snapshots[0]["weights"])


def test_the_patched_server_keeps_sleep_mode_with_the_key_off(upstream_023, trees, vllm_engine, monkeypatch):  # noqa: F811
    workers, models, log, snapshots = cycle(
        upstream_023, trees["full"], vllm_engine, monkeypatch, explicit=False, steps=1
    )
    assert not [e for e in log if e[0] in ("offload_engine", "onload_engine")]
    assert ("sleep", 0, None) in log and ("wake_up", 1, ["weights"]) in log
    for model in models:
        assert_engine_holds(upstream_023, model, snapshots[0]["weights"])


def test_rollout_config_refuses_the_key_with_graphs_sleep_mode_or_mtp(trees):  # noqa: F811
    script = """
from verl.workers.config.rollout import RolloutConfig
ok = RolloutConfig(name="vllm", explicit_offload=True, enforce_eager=True, enable_sleep_mode=False)
assert ok.explicit_offload and not RolloutConfig(name="vllm").explicit_offload
from verl.workers.config.model import MtpConfig
bad_ones = (
    {"enforce_eager": False, "enable_sleep_mode": False},
    {"enforce_eager": True},
    {"enforce_eager": True, "enable_sleep_mode": False, "free_cache_engine": False},
    {"enforce_eager": True, "enable_sleep_mode": False, "mtp": MtpConfig(enable=True, enable_rollout=True)},
)
for bad in bad_ones:
    try:
        RolloutConfig(name="vllm", explicit_offload=True, **bad)
    except ValueError as exc:
        print("refused:", exc)
    else:
        raise SystemExit(f"accepted {bad}")
"""
    env = {**os.environ, "PYTHONPATH": str(trees["full"]), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("refused: rollout.explicit_offload needs") == 4, proc.stdout


def test_the_key_composes_off_by_default(trees):  # noqa: F811
    from ascend_rl import preflight

    base = ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]
    cfg = preflight.compose(trees["full"], "ppo_megatron_trainer", base)
    assert cfg.actor_rollout_ref.rollout.explicit_offload is False
    cfg = preflight.compose(
        trees["full"], "ppo_megatron_trainer", [*base, "actor_rollout_ref.rollout.explicit_offload=True"]
    )
    assert cfg.actor_rollout_ref.rollout.explicit_offload is True
    with pytest.raises(Exception, match="explicit_offload"):
        preflight.compose(
            trees["no-0204"],
            "ppo_megatron_trainer",
            [*base, "actor_rollout_ref.rollout.explicit_offload=True"],
        )
