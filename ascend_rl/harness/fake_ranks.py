"""Build ranks of a launch's Megatron training layout on one CPU, as the base's verl builds them: the shape check's
builder (ascend_rl/shape_check.py runs it; not a user command).

    python -m ascend_rl.harness.fake_ranks SPEC.json OUT.json

Run in the base's e2e environment with its CPU verl tree (the overlay's CPU series: cpu_compat) and its Megatron
packages on PYTHONPATH, and the base's CPU environment (VERL_PLATFORM=cpu ...). SPEC (JSON): model_dir (a folder
with config.json), world, tp, pp, ep, etp, cp, vpp, sequence_parallel, dtype, use_distributed_optimizer,
override_transformer_config, override_ddp_config, ranks: [[rank, "actor" | "ref"], ...], jobs; builder: "engine"
(verl 0.9.1, the default) or "worker" (verl 0.6.0 / 0.7.1), and for the worker freeze_moe_router.

The modules are imported once; then each rank is built in a process of its own (a fork, `jobs` at a time), with
torch.distributed's fake backend at the launch's world size and every tensor on the meta device
(ascend_rl/harness/fake_megatron.py): verl's own MegatronEngine._build_tf_config (the launch's
override_transformer_config onto Megatron-Bridge's provider, engine/megatron/transformer_impl.py:283-412) and
make_megatron_module (the actor wrapped in megatron-core's DDP, the reference not: transformer_impl.py:465-489).
verl 0.6.0 / 0.7.1 with use_mbridge=False (megatron-core 0.12.1) build through their Megatron worker instead
(workers/megatron_workers.py, _init_hf_config_and_tf_config and _build_model_optimizer): verl's own
hf_to_mcore_config(hf_config, dtype, **override_transformer_config), then verl's make_megatron_module with no
bridge, which calls verl's get_model(a provider of init_mcore_model, wrap_with_ddp=..., use_distributed_optimizer=...)
(utils/megatron_utils.py).
Per rank OUT holds: the decoder layers built, dense and expert parameter elements and bytes, and for the actor each
DDP buffer (megatron-core's own padding) with the elements the distributed optimizer gives this rank
(DistributedOptimizer._build_model_gbuf_range); or the error megatron-core raised, in its own words. OUT also names
the megatron-core version that built them (megatron_core).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from pathlib import Path


def _engine_self(spec: dict, hf_config):
    """What MegatronEngine._build_tf_config reads of the engine, from the launch's settings."""
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        local_path=spec["model_dir"],
        trust_remote_code=False,
        model_type="language_model",
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        mtp=types.SimpleNamespace(enable=False),
        get=lambda key, default=None: default,
    )
    # verl's own engine config (its __post_init__ turns sequence parallel off at TP 1, engine.py:239-241)
    from verl.workers.config.engine import McoreEngineConfig

    engine_config = McoreEngineConfig(
        override_transformer_config=dict(spec["override_transformer_config"]),
        tensor_model_parallel_size=spec["tp"],
        pipeline_model_parallel_size=spec["pp"],
        expert_model_parallel_size=spec["ep"],
        expert_tensor_parallel_size=spec["etp"],
        virtual_pipeline_model_parallel_size=spec.get("vpp"),
        context_parallel_size=spec.get("cp", 1),
        sequence_parallel=bool(spec["sequence_parallel"]),
        use_distributed_optimizer=bool(spec["use_distributed_optimizer"]),
        dtype=spec["dtype"],
    )
    return types.SimpleNamespace(
        model_config=model_config,
        engine_config=engine_config,
        enable_routing_replay=False,
        _qat_enabled=False,
    )


def _fake_rank(spec: dict, rank: int) -> None:
    """This process as `rank` of the launch's world: the fake process group, megatron-core's parallel state at the
    launch's sizes (as verl calls initialize_model_parallel), the current device the meta device."""
    from ascend_rl.harness import fake_megatron

    fake_megatron.init_fake_process_group(rank, spec["world"])
    fake_megatron.initialize_model_parallel(
        tensor_model_parallel_size=spec["tp"],
        pipeline_model_parallel_size=spec["pp"],
        virtual_pipeline_model_parallel_size=spec.get("vpp"),
        context_parallel_size=spec.get("cp", 1),
        expert_model_parallel_size=spec["ep"],
        expert_tensor_parallel_size=spec["etp"],
    )
    fake_megatron.on_meta_device()


def build_rank(spec: dict, rank: int, role: str) -> dict:
    """One rank, in this process: what it holds, or megatron-core's refusal."""
    import torch
    from transformers import AutoConfig
    from verl.utils.megatron_utils import McoreModuleWrapperConfig, make_megatron_module
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    t0 = time.monotonic()
    _fake_rank(spec, rank)
    hf_config = AutoConfig.from_pretrained(spec["model_dir"])
    engine = _engine_self(spec, hf_config)
    MegatronEngine._build_tf_config(engine)
    actor = role == "actor"
    wrap = McoreModuleWrapperConfig(
        is_value_model=False,
        wrap_with_ddp=actor,
        use_distributed_optimizer=bool(spec["use_distributed_optimizer"]),
        use_layer_wise_distributed_optimizer=False,
        use_megatron_fsdp=False,
    )
    with torch.device("meta"):
        modules, _ = make_megatron_module(
            wrap_config=wrap,
            tf_config=None,
            hf_config=hf_config,
            bridge=engine.bridge,
            provider=engine.provider,
            override_model_config={},
            override_ddp_config=dict(spec.get("override_ddp_config") or {}),
            peft_cls=None,
            peft_config=None,
        )
    return _measure(spec, rank, role, modules, t0)


def build_rank_worker(spec: dict, rank: int, role: str) -> dict:
    """One rank as verl 0.6.0 / 0.7.1's Megatron worker builds it with use_mbridge=False (megatron-core 0.12.1):
    ActorRolloutRefWorker.init_model / _build_model_optimizer (workers/megatron_workers.py; 0.7.1: :285-294 the
    parallel state, :107-238 the configs, :377-484 the modules; 0.6.0: :203-212, :102-171, :288-373), verl's own
    functions called as the worker calls them."""
    import torch
    from transformers import AutoConfig
    from verl.models.mcore import hf_to_mcore_config
    from verl.models.mcore.config_converter import mapping_string_to_attn_backend
    from verl.utils.megatron_utils import McoreModuleWrapperConfig, make_megatron_module

    from ascend_rl.harness import fake_megatron

    t0 = time.monotonic()
    _fake_rank(spec, rank)
    fake_megatron.meta_modules_stay_on_meta()
    fake_megatron.meta_broadcast_params()
    # _init_hf_config_and_tf_config: the HF config (the tokenizer's token ids it also sets change no shape); 0.7.1's
    # worker turns MTP off (:159-161), 0.6.0's keeps the config's and its converter refuses MTP layers
    hf_config = AutoConfig.from_pretrained(spec["model_dir"])
    if spec.get("base") != "0.6.0" and hasattr(hf_config, "num_nextn_predict_layers"):
        hf_config.num_nextn_predict_layers = 0
    # 0.7.1 takes the launch's megatron.dtype (:579), 0.6.0 builds in bfloat16 whatever it says (:474)
    dtype = torch.bfloat16 if spec.get("base") == "0.6.0" else getattr(torch, spec["dtype"])
    otc = mapping_string_to_attn_backend(dict(spec["override_transformer_config"]))
    tf_config = hf_to_mcore_config(hf_config, dtype, **otc)
    actor = role == "actor"
    wrap = McoreModuleWrapperConfig(
        is_value_model=False,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        wrap_with_ddp=actor,
        use_distributed_optimizer=bool(spec["use_distributed_optimizer"]),
    )
    override_model_config = {"moe_config": {"freeze_moe_router": bool(spec.get("freeze_moe_router"))}}
    kwargs = {"override_ddp_config": dict(spec.get("override_ddp_config") or {})} if actor else {}
    with torch.device("meta"):
        built = make_megatron_module(
            wrap_config=wrap, tf_config=tf_config, hf_config=hf_config, bridge=None,
            override_model_config=override_model_config, **kwargs,
        )  # fmt: skip
    # 0.7.1 returns (modules, tf_config), 0.6.0 the modules
    modules = built[0] if isinstance(built, tuple) else built
    return _measure(spec, rank, role, modules, t0)


def _measure(spec: dict, rank: int, role: str, modules, t0: float) -> dict:
    """What a built rank holds: its layers, parameters and (the actor) DDP buffers."""
    actor = role == "actor"
    out: dict = {"rank": rank, "role": role, "layers": 0, "dense": 0, "expert": 0, "dense_bytes": 0}
    out["expert_bytes"] = 0
    names = []
    layer_numbers = set()
    for module in modules:
        for name, param in module.named_parameters():
            kind = "expert" if ".mlp.experts." in name else "dense"
            out[kind] += param.numel()
            out[f"{kind}_bytes"] += param.numel() * param.element_size()
            names.append(name)
        inner = module
        while hasattr(inner, "module"):  # DDP, then Float16Module, then the GPTModel
            inner = inner.module
        layers = inner.decoder.layers
        out["layers"] += len(layers)
        layer_numbers.update(int(layer.layer_number) for layer in layers)
    out["layer_numbers"] = sorted(layer_numbers)
    out["embedding"] = any("embedding." in n for n in names)
    out["output_layer"] = any(n.endswith("output_layer.weight") for n in names)
    if actor:
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        buffers = []
        for module in modules:
            for kind, group in (("dense", module.buffers), ("expert", module.expert_parallel_buffers)):
                for buf in group:
                    owned = None
                    if spec["use_distributed_optimizer"]:
                        owned = sum(
                            entry["param"].size
                            for index in range(len(buf.buckets))
                            for entry in DistributedOptimizer._build_model_gbuf_range(buf, index)[
                                "param_map"
                            ].values()
                        )
                    buffers.append(
                        {
                            "owned_by_dp_rank": _owned_by_dp_rank(buf),
                            "kind": kind,
                            "numel": int(buf.numel),
                            "params": int(sum(p.numel() for p in buf.params)),
                            "param_dtype": str(buf.param_dtype).replace("torch.", ""),
                            "grad_dtype": str(buf.grad_dtype).replace("torch.", ""),
                            "dp": int(buf.data_parallel_world_size),
                            "owned": owned,
                        }
                    )
        out["buffers"] = buffers
    out["wall_s"] = round(time.monotonic() - t0, 2)
    return out


def _owned_by_dp_rank(buf) -> list[int]:
    """The parameter elements the distributed optimizer gives each DP rank of `buf`: megatron-core's own param range
    map (DistributedOptimizer._build_model_gbuf_param_range_map) of each rank's equal shard of each bucket, the
    shards as _build_model_gbuf_range cuts them (distrib_optimizer.py:188-205) for every rank, not only this one."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

    dp = int(buf.data_parallel_world_size)
    owned = [0] * dp
    for bucket in buf.buckets:
        size = bucket.grad_data.numel()
        per = size // dp
        for r in range(dp):
            world = Range(r * per + bucket.offset, min(size, r * per + per) + bucket.offset)
            ranges = DistributedOptimizer._build_model_gbuf_param_range_map(
                buf.param_index_map, world, bucket.offset
            )
            owned[r] += sum(entry["param"].size for entry in ranges.values())
    return owned


def _one_rank(build, job: dict, path: Path) -> None:
    """A forked child's work: build(**job) written to `path`, or what was raised, in one line with where."""
    try:
        result = build(**job)
    except BaseException as exc:  # noqa: BLE001 - megatron-core / fully_shard refuse with any exception type
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{'/'.join(Path(frame.filename).parts[-3:])}:{frame.lineno}"
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        result = {**_ident(job), "error": f"{type(exc).__name__}: {said}", "where": where}
    path.write_text(json.dumps(result))


def _ident(job: dict) -> dict:
    """What names a job in its result row (its rank, and its role where it has one)."""
    return {k: job[k] for k in ("rank", "role") if k in job}


def fork_each(build, jobs: list[dict], work: Path, parallel: int, label: str) -> list[dict]:
    """build(**job) for each job, each in a forked process of its own (the parent's imports inherited), `parallel`
    at a time: their result rows, a row naming the wait status for a process that died or ran past RANK_TIMEOUT_S."""
    work.mkdir(parents=True, exist_ok=True)
    pending = list(jobs)
    running: dict[int, tuple[dict, Path]] = {}
    results = []
    while pending or running:
        while pending and len(running) < max(1, parallel):
            job = pending.pop(0)
            name = "-".join(str(v) for v in reversed(_ident(job).values()))
            path = work / f"{name}.json"
            path.unlink(missing_ok=True)
            pid = os.fork()
            if pid == 0:  # the child: one rank, then out without the parent's clean-up
                try:
                    _one_rank(build, job, path)
                finally:
                    os._exit(0)
            running[pid] = (job, path)
            what = " ".join(x for x in (job.get("role"), "rank", str(job["rank"])) if x)
            print(f"{label}: building {what}", file=sys.stderr, flush=True)
        pid, status = _wait_one(running, deadline=time.monotonic() + RANK_TIMEOUT_S)
        job, path = running.pop(pid)
        if path.is_file():
            results.append(json.loads(path.read_text()))
        else:
            results.append({**_ident(job), "error": f"the build process died (wait status {status})"})
    return results


def write_result(out_path: Path, result: dict) -> None:
    """The builder's report, written whole or not at all."""
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out_path)


# a rank that has not built by then is stopped (a fork of a threaded process can hang): its row says so
RANK_TIMEOUT_S = 600


def _wait_one(running: dict, deadline: float) -> tuple[int, int]:
    """The next child to end; a child still running at `deadline` is killed (and reported as died)."""
    import signal

    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            return pid, status
        if time.monotonic() > deadline:
            for child in running:
                os.kill(child, signal.SIGKILL)
            return os.wait()
        time.sleep(0.05)


def usage_status(argv: list[str], doc: str) -> int | None:
    """A builder's command line (SPEC OUT): None when it is one, else the exit status after the usage line (0 for
    --help, 2 otherwise)."""
    if len(argv) == 2 and argv[0] not in ("-h", "--help"):
        return None
    print(doc.split("\n\n")[1].strip(), file=sys.stderr if len(argv) != 1 else sys.stdout)
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2


def main(argv: list[str]) -> int:
    status = usage_status(argv, __doc__)
    if status is not None:
        return status
    spec = json.loads(Path(argv[0]).read_text())
    out_path = Path(argv[1])
    t0 = time.monotonic()
    # the imports, once: every child inherits them
    import torch  # noqa: F401
    from transformers import AutoConfig  # noqa: F401
    from verl.utils.megatron import cpu_compat
    from verl.utils.megatron_utils import make_megatron_module  # noqa: F401

    from ascend_rl.harness import fake_megatron

    if spec.get("builder") == "worker":
        from verl.models.mcore import hf_to_mcore_config, init_mcore_model  # noqa: F401

        cpu_compat.apply()
    else:
        from verl.workers.engine.megatron.transformer_impl import MegatronEngine  # noqa: F401

        cpu_compat.apply()
        cpu_compat.import_megatron_bridge()
    fake_megatron.sequence_parallel_torch_norm()
    imported = time.monotonic() - t0
    worker = spec.get("builder") == "worker"

    def build(rank: int, role: str) -> dict:
        return (build_rank_worker if worker else build_rank)(spec, rank, role)

    jobs = [{"rank": int(r), "role": str(role)} for r, role in spec["ranks"]]
    results = fork_each(build, jobs, out_path.with_suffix(".ranks"), int(spec.get("jobs") or 1), "fake_ranks")
    from megatron.core.package_info import __version__ as megatron_core

    write_result(
        out_path, {"imports_s": round(imported, 2), "megatron_core": megatron_core, "ranks": results}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
