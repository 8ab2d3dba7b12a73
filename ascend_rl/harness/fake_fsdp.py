"""Build ranks of a launch's FSDP2 actor on one CPU, as verl 0.9.1's FSDP engine shards it: the shape check's builder
for FSDP launches (ascend_rl/harness/shape_check.py runs it; not a user command).

    python -m ascend_rl.harness.fake_fsdp SPEC.json OUT.json

Run in verl 0.9.1's e2e environment with the recipe's CPU verl tree on PYTHONPATH and the base's CPU environment
(VERL_PLATFORM=cpu ...). SPEC (JSON): model_dir (a folder with config.json), world, fsdp_size, model_dtype,
wrap_policy, reshard_after_forward, ranks: [rank, ...], jobs.

The modules are imported once; then each rank is built in a process of its own (a fork, `jobs` at a time), with
torch.distributed's fake backend at the launch's world size: the Hugging Face model from its config on the meta device
at the engine's model dtype (engine/fsdp/transformer_impl.py:_build_module: fsdp_config.model_dtype, fp32 for
training when unset), verl's own create_device_mesh (engine/fsdp/utils.py) and verl's own apply_fsdp2
(utils/fsdp_utils.py: fully_shard on each decoder layer, then on the model), with the kwargs the engine passes
(transformer_impl.py:450-472). Per rank OUT holds each parameter's local shard (DTensor.to_local().numel(), the view
the optimizer sees) and its stored shard (FSDPParam._sharded_param_data, padded to the first rank's rows), their
sums, the parameters' dtype; or the error the build raised.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def build_rank(spec: dict, rank: int) -> dict:
    """One rank, in this process: what its FSDP2 shards hold."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig, AutoModelForCausalLM
    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.torch_dtypes import PrecisionType
    from verl.workers.engine.fsdp.utils import create_device_mesh

    t0 = time.monotonic()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=spec["world"])
    hf_config = AutoConfig.from_pretrained(spec["model_dir"])
    dtype = PrecisionType.to_dtype(spec["model_dtype"] or "fp32")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype)
    model.to(dtype)  # the engine's own cast: "some parameters may not in torch_dtype"
    mesh = create_device_mesh(world_size=spec["world"], fsdp_size=spec["fsdp_size"])
    # the engine's mixed precision (transformer_impl.py:389-401: param bf16, reduce and buffers fp32 by default)
    mp_policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True
    )
    kwargs = {
        "mesh": mesh,
        "mp_policy": mp_policy,
        "offload_policy": None,
        "reshard_after_forward": bool(spec["reshard_after_forward"]),
    }
    apply_fsdp2(model, kwargs, {"wrap_policy": spec.get("wrap_policy") or {}})
    stored = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            for fp in group.fsdp_params if group else ():
                stored[id(fp.sharded_param)] = int(fp._sharded_param_data.numel())
    params = []
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        params.append(
            {
                "name": name,
                "shape": list(param.shape),
                "local": int(local.numel()),
                "stored": stored.get(id(param), int(local.numel())),
                "dtype": str(param.dtype).replace("torch.", ""),
            }
        )
    return {
        "rank": rank,
        "params": params,
        "local": sum(p["local"] for p in params),
        "stored": sum(p["stored"] for p in params),
        "element_size": next(model.parameters()).element_size(),
        "wall_s": round(time.monotonic() - t0, 2),
    }


def main(argv: list[str]) -> int:
    from ascend_rl.harness.fake_ranks import fork_each, usage_status, write_result

    status = usage_status(argv, __doc__)
    if status is not None:
        return status

    spec = json.loads(Path(argv[0]).read_text())
    out_path = Path(argv[1])
    t0 = time.monotonic()
    # the imports, once: every child inherits them
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401
    from verl.utils.fsdp_utils import apply_fsdp2  # noqa: F401

    imported = time.monotonic() - t0
    jobs = [{"rank": int(r)} for r in spec["ranks"]]
    results = fork_each(
        lambda rank: build_rank(spec, rank),
        jobs,
        out_path.with_suffix(".ranks"),
        int(spec.get("jobs") or 1),
        "fake_fsdp",
    )
    import torch as _torch

    write_result(out_path, {"imports_s": round(imported, 2), "torch": _torch.__version__, "ranks": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
