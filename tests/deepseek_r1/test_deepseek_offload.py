"""Patch ds-0004 (explicit engine offload) on the deepseek_r1-patched verl 0.6.0 tree.

The offload helpers run on real tensors. The worker and rollout methods are the patched source itself, taken
out of megatron_workers.py / vllm_rollout_spmd.py (neither imports here: no megatron-core, no vLLM runtime) and
run against doubles that stand in only for the NPU engine's worker and for Megatron's DDP buffers and its
load/offload functions; those doubles hold real tensors whose storages are freed and re-allocated.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

MEGATRON = "verl/workers/megatron_workers.py"
SPMD = "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py"


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    """The deepseek_r1-patched verl 0.6.0 tree (shared, read only)."""
    return patched_verl("deepseek_r1")


@pytest.fixture(scope="module")
def eo():
    """The module ds-0004 installs, imported from the repository (test_installs.py: the tree holds these bytes)."""
    from llm_rl.deepseek_r1.verl_modules import explicit_offload

    return explicit_offload


def _methods(path: Path, cls: str, names: list[str], namespace: dict) -> dict:
    """The named methods of `cls` in the file, decorators dropped, compiled against `namespace`."""
    tree = ast.parse(path.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = [
        n for n in klass.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in names
    ]
    assert sorted(n.name for n in found) == sorted(names)
    for node in found:
        node.decorator_list = []
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def _live(tensors) -> int:
    """Bytes of device storage behind the tensors, each shared storage counted once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


# --- helpers on real tensors -------------------------------------------------------------------------------------


class TinyModel(torch.nn.Module):
    """Stands in for the engine's model: a tied weight, a view of a fused weight, a buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.qkv = torch.nn.Parameter(torch.randn(24, 8))
        self.register_buffer("cos_sin", torch.randn(32, 4))

    def q(self):
        return self.qkv[:8]


def test_weights_offload_frees_storage_and_onload_is_bit_identical(eo):
    model = TinyModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q_view = model.q()
    offloader = eo.StorageOffloader(keep_host_copy=True)

    freed = offloader.offload(eo.model_tensors(model))
    assert freed == (16 * 8 + 24 * 8 + 32 * 4) * 4  # the tied weight counted once
    assert _live(eo.model_tensors(model)) == 0 and offloader.offloaded
    assert offloader.offload(eo.model_tensors(model)) == 0, (
        "a second offload must not overwrite the host copy"
    )

    assert offloader.onload() == freed
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert model.head.weight is model.embed.weight and torch.equal(q_view, before["qkv"][:8])
    assert offloader.onload() == 0


class Layer:
    def __init__(self):
        self.kv_cache = [torch.tensor([])]


def _runner(model):
    """A model runner the way vLLM binds its cache: a raw buffer viewed per layer, runner.kv_caches in layer order."""
    raw = torch.randn(2 * 3 * 4 * 8)
    k, v = torch.randn(5, 4), torch.randn(5, 4)  # vLLM-Ascend MLA keeps a (k, v) pair per layer
    layers = {"l0": Layer(), "l1": Layer(), "l2": Layer()}
    layers["l0"].kv_cache = [raw[:96].view(2, 3, 4, 4)]
    layers["l1"].kv_cache = [raw[96:].view(2, 3, 4, 4)]
    layers["l2"].kv_cache = [(k, v)]
    config = types.SimpleNamespace(compilation_config=types.SimpleNamespace(static_forward_context=layers))
    runner = types.SimpleNamespace(
        model=model,
        vllm_config=config,
        kv_caches=[layers["l0"].kv_cache[0], layers["l1"].kv_cache[0], (k, v)],
    )
    return runner, layers


def test_release_frees_cache_and_weights_resume_restores_them(eo):
    model = TinyModel()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    runner, layers = _runner(model)
    offload = eo.ExplicitEngineOffload(types.SimpleNamespace(model_runner=runner))
    cache_bytes = _live(eo.kv_cache_tensors(runner))
    assert cache_bytes == (192 + 40) * 4

    offload.release()
    assert _live(eo.kv_cache_tensors(runner)) == 0 and _live(eo.model_tensors(model)) == 0

    offload.resume(tags=["weights"])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert _live(eo.kv_cache_tensors(runner)) == 0, "the cache must wait for resume(['kv_cache'])"

    offload.resume(tags=["kv_cache"])
    assert _live(eo.kv_cache_tensors(runner)) == cache_bytes
    assert layers["l0"].kv_cache[0].shape == (2, 3, 4, 4) and layers["l2"].kv_cache[0][1].shape == (5, 4)
    assert layers["l0"].kv_cache[0] is runner.kv_caches[0], (
        "the attention layers must stay bound to the cache"
    )
    layers["l1"].kv_cache[0].fill_(7.0)
    assert runner.kv_caches[1].sum() == 7.0 * 96 and all(t.abs().sum() == 0 for t in runner.kv_caches[2])


class Buffer:
    """Megatron's _ParamAndGradBuffer as verl's offload functions use it: param_data, grad_data, cpu_data."""

    def __init__(self, n):
        self.param_data, self.grad_data = torch.randn(n), torch.randn(n)


class DDP:
    def __init__(self, *sizes):
        self.buffers, self.expert_parallel_buffers = [Buffer(sizes[0])], [Buffer(s) for s in sizes[1:]]

    def train(self):
        pass


def megatron_load(models, load_grad=True):
    """verl's load_megatron_model_to_gpu on these buffers: re-allocate, copy the host copy back (no-op if resident)."""
    for chunk in models:
        for buffer in chunk.buffers + chunk.expert_parallel_buffers:
            if load_grad:
                buffer.grad_data.storage().resize_(buffer.grad_data_size)
                buffer.grad_data.zero_()
            if buffer.param_data.storage().size() == 0:
                buffer.param_data.storage().resize_(buffer.param_data_size)
                buffer.param_data.copy_(buffer.param_data.cpu_data)


def megatron_offload(models):
    """verl's offload_megatron_model_to_cpu on these buffers."""
    for chunk in models:
        for buffer in chunk.buffers + chunk.expert_parallel_buffers:
            if buffer.param_data.storage().size() > 0:
                buffer.param_data.cpu_data = buffer.param_data.data.clone()
                buffer.param_data_size = buffer.param_data.storage().size()
                buffer.param_data.storage().resize_(0)
            if buffer.grad_data.storage().size() > 0:
                buffer.grad_data_size = buffer.grad_data.storage().size()
                buffer.grad_data.storage().resize_(0)


def test_actor_residency_and_grad_free(eo):
    actor = [DDP(6, 4)]
    assert eo.actor_params_resident(actor)
    eo.free_actor_grads(actor)
    grads = [b.grad_data for b in actor[0].buffers + actor[0].expert_parallel_buffers]
    assert _live(grads) == 0 and eo.actor_params_resident(actor)
    megatron_load(actor)  # the next update_actor re-creates the grads from the recorded size
    assert _live(grads) == 10 * 4
    megatron_offload(actor)
    assert not eo.actor_params_resident(actor)
    plain = torch.nn.Linear(2, 2)  # a plain module on the host counts as offloaded
    assert not eo.actor_params_resident([plain])


# --- the patched worker and rollout methods ----------------------------------------------------------------------


class World:
    """Records the worker's steps and the bytes alive on the 'device' at each of them."""

    def __init__(self, eo):
        self.eo, self.events = eo, []
        self.actor = [DDP(64, 32)]
        self.model = TinyModel()
        self.runner, _ = _runner(self.model)
        self.engine_calls = []

    def device_state(self) -> dict:
        params = [b.param_data for b in self.actor[0].buffers + self.actor[0].expert_parallel_buffers]
        return {
            "actor": _live(params) > 0,
            "engine_weights": _live(self.eo.model_tensors(self.model)) > 0,
            "kv_cache": _live(self.eo.kv_cache_tensors(self.runner)) > 0,
        }

    def record(self, name, fn=None):
        def wrapped(*args, **kwargs):
            self.events.append(name)
            return fn(*args, **kwargs) if fn else None

        return wrapped


def _worker_and_rollout(eo, patched, explicit: bool):
    world = World(eo)
    memory = []
    ns = {
        "aggressive_empty_cache": lambda **_: None,
        "set_expandable_segments": lambda _: None,
        "log_gpu_memory_usage": lambda *a, **k: None,
        "get_torch_device": lambda: types.SimpleNamespace(
            get_rng_state=lambda: 0,
            set_rng_state=lambda _: None,
            max_memory_allocated=lambda: 0,
            max_memory_reserved=lambda: 0,
        ),
        "per_tensor_generator": lambda *a, **kw: iter(()),
        "load_megatron_model_to_gpu": world.record("load actor", megatron_load),
        "offload_megatron_model_to_cpu": world.record("offload actor", megatron_offload),
        "load_megatron_optimizer": world.record("load optimizer"),
        "offload_megatron_optimizer": world.record("offload optimizer"),
        "actor_params_resident": eo.actor_params_resident,
        "free_actor_grads": world.record("free actor grads", eo.free_actor_grads),
        "os": os,
        "logger": None,
    }
    worker_fns = _methods(
        patched / MEGATRON, "ActorRolloutRefWorker", ["rollout_mode", "trainer_mode", "update_actor"], ns
    )
    rollout_fns = _methods(
        patched / SPMD, "vLLMRollout", ["resume", "release"], {"inspect": __import__("inspect")}
    )

    config = types.SimpleNamespace(free_cache_engine=True, explicit_offload=explicit)
    engine = types.SimpleNamespace(
        wake_up=world.record("engine.wake_up"),  # sleep mode: what vLLM would do on its own memory pool
        sleep=world.record("engine.sleep"),
        reset_prefix_cache=lambda: None,
    )
    rollout = types.SimpleNamespace(
        config=config, inference_engine=engine, sleep_level=1, explicit_offload=None
    )
    if explicit:
        offload = eo.ExplicitEngineOffload(types.SimpleNamespace(model_runner=world.runner))
        offload.weights.onload = world.record("onload engine weights", offload.weights.onload)
        offload.kv_cache.onload = world.record("init kv cache", offload.kv_cache.onload)
        offload.release = world.record("free kv cache + offload engine weights", offload.release)
        rollout.explicit_offload = offload
    rollout.resume = types.MethodType(rollout_fns["resume"], rollout)
    rollout.release = types.MethodType(rollout_fns["release"], rollout)

    async def update_weights(weights, **_):
        world.events.append("update_weights")
        memory.append(world.device_state())

    rollout.update_weights = update_weights

    class Cfg(dict):
        __getattr__ = dict.__getitem__

    worker = types.SimpleNamespace(
        # temperature: update_actor hands the rollout's to the actor (shared-0101), as the real config has it
        config=Cfg(rollout=Cfg(free_cache_engine=True, explicit_offload=explicit, temperature=1.0)),
        _is_offload_param=True,
        _is_offload_optimizer=True,
        bridge=None,
        actor=types.SimpleNamespace(actor_module=world.actor),
        actor_module=world.actor,
        rollout=rollout,
        actor_model_config=None,
        weight_converter=None,
        tf_config=None,
        layer_name_mapping=None,
        gen_random_states=0,
        torch_random_states=0,
    )
    for name, fn in worker_fns.items():
        setattr(worker, name, types.MethodType(fn, worker))
    return world, worker, memory


def _step(world, worker):
    """trainer_mode at init, then generate (rollout_mode, trainer_mode) and the actor's offload/keep after update."""
    megatron_offload(world.actor)  # init_model offloads the actor
    asyncio.run(worker.trainer_mode())
    world.events.clear()
    asyncio.run(worker.rollout_mode())
    rollout_events = list(world.events)
    asyncio.run(worker.trainer_mode())
    return rollout_events


def test_explicit_offload_order_and_peak(eo, patched):
    world, worker, memory = _worker_and_rollout(eo, patched, explicit=True)
    assert world.device_state() == {"actor": True, "engine_weights": True, "kv_cache": True}
    first = _step(world, worker)
    assert first == [
        "load actor",
        "onload engine weights",
        "update_weights",
        "offload actor",
        "init kv cache",
    ]
    assert memory[0] == {"actor": True, "engine_weights": True, "kv_cache": False}, (
        "no KV cache during the reshard"
    )
    assert world.device_state() == {"actor": False, "engine_weights": False, "kv_cache": False}

    # after update_actor the params stay for the reshard: no offload there, no reload in rollout_mode
    megatron_load(world.actor)
    world.events.clear()
    worker.config.rollout["explicit_offload"] = True
    _end_of_update_actor(worker, world)
    assert "offload actor" not in world.events and "free actor grads" in world.events
    world.events.clear()
    asyncio.run(worker.rollout_mode())
    assert world.events == ["onload engine weights", "update_weights", "offload actor", "init kv cache"]
    assert "engine.wake_up" not in world.events and "engine.sleep" not in world.events


def test_explicit_offload_reloads_after_a_checkpoint_save_offloaded_the_actor(eo, patched):
    world, worker, _ = _worker_and_rollout(eo, patched, explicit=True)
    megatron_offload(world.actor)  # save_checkpoint ends by offloading the params
    asyncio.run(worker.rollout_mode())
    assert world.events[:2] == ["load actor", "onload engine weights"]


def test_key_off_keeps_upstream_behaviour(eo, patched):
    world, worker, memory = _worker_and_rollout(eo, patched, explicit=False)
    first = _step(world, worker)
    assert first == ["load actor", "engine.wake_up", "update_weights", "offload actor", "engine.wake_up"]
    megatron_load(world.actor)
    world.events.clear()
    _end_of_update_actor(worker, world)
    assert "offload actor" in world.events and "free actor grads" not in world.events


def _end_of_update_actor(worker, world):
    """Run the patched update_actor with a one-step actor, optimizer and metrics stand-ins."""
    opt = types.ModuleType("verl.utils.megatron.optimizer")
    opt.get_megatron_last_lr = lambda _: 0.0
    saved = sys.modules.get(opt.__name__)
    sys.modules[opt.__name__] = opt
    try:
        fn = worker.update_actor.__func__
        g = fn.__globals__

        class _Timer:
            last = 1.0

            def __init__(self, **_):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        g.update(
            Timer=_Timer,
            psutil=types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(used=0)),
            DataProto=lambda meta_info: types.SimpleNamespace(to=lambda _: meta_info),
        )
        worker.config.actor = types.SimpleNamespace(ppo_micro_batch_size_per_gpu=1, ppo_epochs=1)
        worker.actor.make_minibatch_iterator = lambda data: []
        worker.actor.update_policy = lambda dataloader: {}
        worker.flops_counter = types.SimpleNamespace(estimate_flops=lambda *a: (1.0, 1.0))
        worker.world_size = 1
        worker.actor_optimizer = None
        worker.actor_optimizer_scheduler = types.SimpleNamespace(step=lambda _: None)
        worker._is_actor = True
        data = types.SimpleNamespace(meta_info={"global_token_num": [1]})
        worker.update_actor(data)
    finally:
        if saved is None:
            sys.modules.pop(opt.__name__)
        else:
            sys.modules[opt.__name__] = saved


def test_engine_built_without_sleep_mode_when_on(patched):
    tree = ast.parse((patched / SPMD).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "LLM"]
    assert len(calls) == 1
    expr = next(k.value for k in calls[0].keywords if k.arg == "enable_sleep_mode")
    code = compile(ast.Expression(expr), SPMD, "eval")
    outcomes = {
        (free, explicit): eval(
            code, {"config": types.SimpleNamespace(free_cache_engine=free, explicit_offload=explicit)}
        )
        for free in (True, False)
        for explicit in (True, False)
    }
    assert outcomes == {(True, True): False, (True, False): True, (False, True): False, (False, False): False}


CONFIG_PROBE = r"""
import json, sys
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

tree, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for name, overrides in cases:
    with initialize_config_dir(config_dir=tree + "/verl/trainer/config", version_base=None):
        cfg = compose(config_name=name, overrides=overrides)
    try:
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        out.append(["ok", rollout.explicit_offload])
    except Exception as exc:  # hydra wraps the dataclass's ValueError in an InstantiationException
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""

CASES = {
    "default": ["actor_rollout_ref.rollout.name=vllm"],
    "on_eager": [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.explicit_offload=True",
        "actor_rollout_ref.rollout.enforce_eager=True",
    ],
    "on_graph": [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.explicit_offload=True",
        "actor_rollout_ref.rollout.enforce_eager=False",
    ],
    "on_async": [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.explicit_offload=True",
    ],
}


@pytest.fixture(scope="module")
def config_outcomes(patched) -> dict:
    cases, keys = [], []
    for name in ("ppo_trainer", "ppo_megatron_trainer"):
        for key, overrides in CASES.items():
            cases.append([name, overrides])
            keys.append((name, key))
    proc = subprocess.run(
        [sys.executable, "-c", CONFIG_PROBE, str(patched), json.dumps(cases)],
        env={**os.environ, "PYTHONPATH": str(patched)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(keys, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_key_composes_defaults_off_and_refuses_graph_mode(config_outcomes, trainer):
    assert config_outcomes[(trainer, "default")] == ["ok", False]
    assert config_outcomes[(trainer, "on_eager")] == ["ok", True]
    state, message = config_outcomes[(trainer, "on_graph")]
    assert state == "refused" and "enforce_eager=True" in message
    assert config_outcomes[(trainer, "on_async")][0] == "refused"
