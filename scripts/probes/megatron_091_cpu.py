"""Probe: verl 0.9.1's MegatronEngine on CPU, megatron-core 0.16 and a bridge, a tiny DeepSeek-V3 (issue 46).

What docs/deepseek-0.9.1.md section 5 reports was run with this script. It is a probe, not a check: every
workaround is a monkeypatch named in FIXES, applied only when given with --fix, so that leaving one out shows
the error it gets past. Nothing here is part of a recipe or the overlay.

Environment (nothing goes into the shared venvs): a Python 3.12 venv whose .pth adds the 0.9.1 e2e venv,
with megatron-core 0.16.x, megatron-bridge 0.3.1 and mbridge 0.15.1 installed --no-deps:

    python3.12 -m venv /tmp/probe46
    echo "import site; site.addsitedir('$(readlink -f .venv-e2e-091)/lib/python3.12/site-packages')" \
        > /tmp/probe46/lib/python3.12/site-packages/zz_e2e091.pth
    /tmp/probe46/bin/pip install --no-deps "$(grep '^megatron-core==' constraints-0.9.1.txt)" \
        "$(grep '^megatron-bridge==' constraints-0.9.1.txt)" \
        "$(grep '^mbridge==' constraints.txt)"    # constraints-0.9.1.txt's and constraints.txt's pins

The overlay now does what the --fix workarounds did (patches/cpu/cpu-0016, cpu-0017; docs/deepseek-0.9.1.md
section 5): on a tree made with it they are not needed, and the Megatron-Bridge path runs without any; the check
that runs it is tests/harness/test_megatron_engine_091.py. The folder artifacts.megatron_packages(python, "0.9.1")
builds holds the same packages without mbridge.

The tree is `overlay apply qwen2_5 --base 0.9.1 --with cpu`'s (cpu-0014's platform); the model a
`ascend_rl.tiny.deepseek_v3.make_checkpoint` (--make-model writes one, with a random router bias). Two
processes, EP=2, through export and a checkpoint round trip, on the Megatron-Bridge path:

    PYTHONPATH=$PWD:$PWD/llm_rl/qwen2_5/verl-0.9.1-cpu nice -n 19 /tmp/probe46/bin/python \
        -m torch.distributed.run --nproc-per-node 2 scripts/probes/megatron_091_cpu.py --ep 2 --stop ckpt --fix bridge-all
    # the mbridge path: --bridge mbridge --fix mbridge-all --stop update
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time
import types
from pathlib import Path

from ascend_rl.harness.megatron_engine_091 import (
    OVERRIDES,
    against_hf,
    checkpoint_round_trip,
    engine_log_probs,
    export_against_checkpoint,
    export_into_hf,
    make_batch,
    one_update,
)

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "llm_rl" / "qwen2_5" / "verl-0.9.1-cpu"
# the CPU platform of cpu-0014, as the recipe's cpu_env loads it
CPU_ENV = {
    "VERL_USE_EXTERNAL_MODULES": "verl.plugin.platform.platform_cpu",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
}
LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$")
T0 = time.time()


def log(*args) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"[r{os.environ.get('RANK', '0')} {time.time() - T0:6.1f}s rss={rss}MB]", *args, flush=True)


def grouped_name(name: str) -> str:
    """SequentialMLP's local_experts.<L>.linear_fcK.weight under the grouped name the bridges map: linear_fcK.weight<L>."""
    return LOCAL_EXPERT.sub(lambda m: f".mlp.experts.{m.group(2)}.weight{m.group(1)}", name)


# --- importing Megatron-Bridge without TransformerEngine ----------------------------------------------------------


def import_megatron_bridge() -> None:
    """megatron-bridge 0.3.1 imports transformer_engine.pytorch at module scope (peft/lora_layers.py, peft/lora.py):
    stub it for that import only, after megatron-core has decided it has no TE."""
    import megatron.core  # noqa: F401
    from megatron.core.extensions import transformer_engine  # noqa: F401
    from megatron.core.models.gpt import gpt_layer_specs  # noqa: F401
    from megatron.core.transformer import multi_latent_attention  # noqa: F401

    _cpu_compat()._import_bridge_under_te_stub()
    # the flag that picks the DeepSeek layer spec was computed under the stub (cpu_compat resets every HAVE_TE)
    from megatron.bridge.models.deepseek import deepseek_v3_bridge

    assert deepseek_v3_bridge.HAVE_TE is False


# --- the workarounds ----------------------------------------------------------------------------------------------

FIXES = {}


def fix(name):
    def register(func):
        FIXES[name] = func
        return func

    return register


def _cpu_compat():
    from ascend_rl.harness.verl_modules import cpu_compat

    return cpu_compat


@fix("cpu_compat")
def _apply_cpu_compat():
    """the 0.7.1 overlay's megatron-core CPU shims (cpu-0011), all of them; $CPU_COMPAT_SKIP leaves one out"""
    cpu_compat = _cpu_compat()
    skip = os.environ.get("CPU_COMPAT_SKIP", "")
    for step in (
        "_cpu_rng_tracker",
        "_cpu_current_device",
        "_cuda_placements_on_cpu",
        "_inert_streams",
        "_split_sizes_as_asked",
        "_no_fp8_no_quantize",
        "_local_core_attention",
    ):
        if step != skip:
            getattr(cpu_compat, step)()
    cpu_compat._applied = True


@fix("sdpa_backends")
def _sdpa_backends():
    """megatron-core 0.16's local spec takes its core attention from models/backends.py"""
    from megatron.core.models import backends

    backends.DotProductAttention = _cpu_compat()._sdpa_core_attention_class()


@fix("mla_no_te")
def _mla_no_te():
    """MLA's HAVE_TE is True without TE (its extensions import succeeds with a MagicMock te)"""
    from megatron.core.transformer import multi_latent_attention

    multi_latent_attention.HAVE_TE = False


@fix("te_general_gemm")
def _te_general_gemm():
    """moe_utils reads te_general_gemm, defined only when TE imports"""
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = None


@fix("inert_event")
def _inert_event():
    """the alltoall dispatcher synchronizes on the event its DtoH stream records"""

    def record_event(self, event=None):
        return (
            event
            if event is not None
            else types.SimpleNamespace(synchronize=lambda: None, wait=lambda *a: None)
        )

    _cpu_compat()._InertStream.record_event = record_event


@fix("bridge_local_experts")
def _bridge_local_experts():
    """Megatron-Bridge maps routed experts under grouped names only: rename SequentialMLP's first"""
    from megatron.bridge.models.conversion import model_bridge

    original = model_bridge._megatron_local_name_to_global

    def local_name_to_global(models, config, param_name, vp_stage=None):
        return original(models, config, grouped_name(param_name), vp_stage)

    model_bridge._megatron_local_name_to_global = local_name_to_global


@fix("cuda_sync")
def _cuda_sync():
    """dist_checkpointing's save preload calls torch.cuda.synchronize()"""
    import torch

    torch.cuda.synchronize = lambda device=None: None


@fix("optim_load_no_grad")
def _optim_load_no_grad():
    """the distributed optimizer copies a loaded state in place into parameters that require grad"""
    _cpu_compat()._optimizer_load_under_no_grad()


@fix("mbridge_rope_theta")
def _mbridge_rope_theta():
    """mbridge reads hf_config.rope_theta, which transformers 5 keeps in rope_parameters"""
    from mbridge import AutoBridge

    original = AutoBridge.from_config.__func__

    def from_config(cls, hf_config, **kwargs):
        if not hasattr(hf_config, "rope_theta"):
            hf_config.rope_theta = hf_config.rope_parameters["rope_theta"]
        return original(cls, hf_config, **kwargs)

    AutoBridge.from_config = classmethod(from_config)


@fix("mbridge_mla_config")
def _mbridge_mla_config():
    """mbridge passes max_position_embeddings; megatron-core 0.16's MLA config calls it original_max_position_embeddings"""
    from mbridge.models.deepseek_v3 import DeepseekV3Bridge
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    def make(**kwargs):
        if "max_position_embeddings" in kwargs:
            kwargs["original_max_position_embeddings"] = kwargs.pop("max_position_embeddings")
        return MLATransformerConfig(**kwargs)

    DeepseekV3Bridge.TransformerConfigClass = staticmethod(make)


@fix("mbridge_local_spec")
def _mbridge_local_spec():
    """mbridge asks megatron-core for the TransformerEngine layer spec unconditionally"""
    from mbridge.core import llm_bridge

    original = llm_bridge.get_gpt_decoder_block_spec

    def local_spec(config, use_transformer_engine=True, **kwargs):
        return original(config, use_transformer_engine=False, **kwargs)

    llm_bridge.get_gpt_decoder_block_spec = local_spec


@fix("mbridge_fp32_io")
def _mbridge_fp32_io():
    """mbridge's DeepSeek-V3 reads checkpoints through its bf16-only FP8-dequantising reader"""
    from mbridge.core.bridge import Bridge
    from mbridge.models.deepseek_v3 import DeepseekV3Bridge

    DeepseekV3Bridge._get_safetensor_io = Bridge._get_safetensor_io


@fix("mbridge_local_names")
def _mbridge_local_names():
    """mbridge maps TE's fused MLA layer-norm names and grouped expert names only"""
    from mbridge.core.bridge import Bridge
    from mbridge.models.deepseek_v3 import DeepseekV3Bridge

    DeepseekV3Bridge._ATTENTION_MAPPING = {
        **DeepseekV3Bridge._ATTENTION_MAPPING,
        "self_attention.q_layernorm.weight": ["model.layers.{layer_number}.self_attn.q_a_layernorm.weight"],
        "self_attention.kv_layernorm.weight": ["model.layers.{layer_number}.self_attn.kv_a_layernorm.weight"],
    }
    original = Bridge._weight_name_mapping_mcore_local_to_global

    def local_to_global(self, model, consider_ep=True):
        names = {k: grouped_name(v) for k, v in original(self, model, consider_ep=False).items()}
        if consider_ep and self.mpu.ep_size > 1:
            per_rank = self.config.num_moe_experts // self.mpu.ep_size
            for k, v in names.items():
                if ".mlp.experts.linear_fc" in v:
                    prefix, local = v.split(".weight")
                    names[k] = f"{prefix}.weight{int(local) + per_rank * self.mpu.ep_rank}"
        return names

    Bridge._weight_name_mapping_mcore_local_to_global = local_to_global


COMMON = [
    "cpu_compat",
    "sdpa_backends",
    "mla_no_te",
    "te_general_gemm",
    "inert_event",
    "cuda_sync",
    "optim_load_no_grad",
]
GROUPS = {
    "bridge-all": [*COMMON, "bridge_local_experts"],
    "mbridge-all": [
        *COMMON,
        "mbridge_rope_theta",
        "mbridge_mla_config",
        "mbridge_local_spec",
        "mbridge_fp32_io",
        "mbridge_local_names",
    ],
}


# --- the run ------------------------------------------------------------------------------------------------------


def make_model(out_dir: Path) -> None:
    """The tiny DeepSeek-V3, its router bias random (transformers 5 keeps it in a buffer the maker does not touch)."""
    import torch

    from ascend_rl.tiny.deepseek_v3 import make_checkpoint

    def random_bias(model, tokenizer):
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)

    make_checkpoint(out_dir, prepare=random_bias)


def build_engine(args):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine import EngineRegistry

    engine_config = McoreEngineConfig(
        expert_model_parallel_size=args.ep,
        sequence_parallel=False,
        dtype="bfloat16",
        vanilla_mbridge=args.bridge == "mbridge",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        infer_micro_batch_size_per_gpu=2,
        override_transformer_config=dict(OVERRIDES),
        seed=1,
        param_offload=args.offload,
        optimizer_offload=args.offload,
    )
    if not args.bf16:  # McoreEngineConfig.__post_init__ takes bf16 / fp16 only
        object.__setattr__(engine_config, "dtype", "float32")
    return EngineRegistry.new(
        model_type="language_model",
        backend="megatron",
        model_config=HFModelConfig(path=str(args.model), use_remove_padding=True),
        engine_config=engine_config,
        optimizer_config=McoreOptimizerConfig(lr=1e-2, total_training_steps=1, lr_warmup_steps_ratio=0.0),
        checkpoint_config=CheckpointConfig(),
    )


def run(args) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.bridge == "megatron-bridge":
        import_megatron_bridge()
    for name in [f for group in args.fix.split(",") if group for f in GROUPS.get(group, [group])]:
        FIXES[name]()
        log("fix", name)

    engine = build_engine(args)
    engine.initialize()
    log(
        "engine.initialize() ok",
        {k: getattr(engine.tf_config, k, None) for k in ("moe_grouped_gemm", "rope_type")},
    )
    if args.stop == "init":
        return

    batch = make_batch(engine.model_config.hf_config.vocab_size, rank)
    mask = batch.batch["response_mask"].bool()
    t = time.time()
    lp, gaps = against_hf(engine, args.model, batch)
    log(f"forward {time.time() - t:.1f}s: max |megatron - HF| {gaps['logprob_gap']:.3e}")
    log(f"negative control (HF experts rolled): {gaps['control_gap_experts_rolled']:.3e}")
    log(f"export: {export_against_checkpoint(engine, args.model)}")
    if args.stop == "export":
        return

    out, td = one_update(engine, rank, world)
    lp_after = engine_log_probs(engine, batch)
    log(
        f"update: grad_norm {out['metrics'].get('grad_norm')}, log-probs moved {(lp_after - lp).abs()[mask].max():.3e}"
    )
    log(
        f"export after the update into HF: {export_into_hf(engine, args.model, args.work / f'exported-r{rank}', batch, lp_after)}"
    )
    if args.stop == "update":
        return
    log(f"checkpoint: {checkpoint_round_trip(engine, args.work / 'ckpt', td, batch, lp_after)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bridge", choices=["megatron-bridge", "mbridge"], default="megatron-bridge")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (the process count, or 1)")
    parser.add_argument(
        "--fix", default="", help=f"comma-separated fixes or groups: {sorted(FIXES)}, {sorted(GROUPS)}"
    )
    parser.add_argument("--stop", choices=["init", "export", "update", "ckpt"], default="update")
    parser.add_argument("--model", type=Path, default=Path("/tmp/probe46-model"))
    parser.add_argument(
        "--make-model", action="store_true", help="write the tiny checkpoint to --model and exit"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/probe46-work"))
    parser.add_argument("--tree", type=Path, default=TREE, help="the verl 0.9.1 tree with the CPU overlay")
    parser.add_argument("--offload", action="store_true", help="param_offload and optimizer_offload")
    parser.add_argument(
        "--bf16", action="store_true", help="the engine's dtype as verl allows it (default fp32)"
    )
    args = parser.parse_args()
    if args.make_model:
        make_model(args.model)
        return 0
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import verl
    except ModuleNotFoundError:
        parser.error(f"verl is not importable: put the repository and {args.tree} on PYTHONPATH")
    if not Path(verl.__file__).resolve().is_relative_to(args.tree.resolve()):
        parser.error(f"verl is imported from {verl.__file__}, not from {args.tree}: put both on PYTHONPATH")
    args.work.mkdir(parents=True, exist_ok=True)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        run(args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
