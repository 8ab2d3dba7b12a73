"""A vLLM general plugin for the verl 0.9.1 CPU runs: keep each linear layer's weight where a weight update finds it.

vLLM's CPU build pre-packs linear weights for oneDNN and drops `layer.weight` when it can
(vllm/model_executor/layers/utils.py, `remove_weight=True` where `ops._supports_onednn`). verl 0.9.1's weight update
then loads a [128, 128] tensor into a zero-size parameter at the first sync and the run hangs; keeping the weight but
not re-packing would let vLLM sample from the initial weights without a word. With oneDNN's path off, vLLM uses
torch's own linear on `layer.weight`, which the sync updates in place.

A second entry point keeps vLLM's MoE working on an x86 CPU without AVX-512 (AVX2 only): there vLLM loads `_C_AVX2`,
which has no `prepack_moe_weight`, so `CPUFusedMOE.check_grouped_gemm` falls back to `forward_torch`. Its
`cpu_fused_moe_torch` runs the experts' activation through `_CPU_MOE_ACT_FN`, whose SiLU entry builds a `SiluAndMul`
(a CustomOp) at forward time, outside `set_current_vllm_config`: the first generation fails with "Current vLLM config
is not set" (vllm/model_executor/layers/fused_moe/cpu_fused_moe.py, the SILU entry; custom_op.py's __init__). The entry
is replaced by `SiluAndMul.forward_native`, the same static method the instance would call, built nowhere.
RECIPES_VLLM_CPU_MOE=torch forces that path on a CPU with AVX-512 too (check_grouped_gemm answers no), so the AVX2 path
runs in CI whatever the machine; each MoE layer's path is logged once per process ("recipes: vLLM CPU MoE path …").

Installed at the root of a verl 0.9.1 CPU tree (the CPU overlay, cpu-0014), with the `vllm` dist-info record whose
entry point names it (group vllm.general_plugins): vLLM loads general plugins in every process it starts (the
engine core, each worker) before it builds the model. It imports nothing of verl, so the engine does not pay
verl's start-up for it.
"""


def keep_linear_weights() -> None:
    """vLLM's general-plugin entry point: turn oneDNN's weight pre-packing off in this process."""
    import vllm._custom_ops as ops

    ops._supports_onednn = False


FORCE_ENV = "RECIPES_VLLM_CPU_MOE"


def cpu_moe_outside_config() -> None:
    """vLLM's general-plugin entry point: the CPU MoE's torch path (AVX2) without a CustomOp built at forward time;
    RECIPES_VLLM_CPU_MOE=torch takes that path on any x86 CPU."""
    import logging
    import os

    forced = os.environ.get(FORCE_ENV, "")
    if forced not in ("", "torch"):
        raise ValueError(f"{FORCE_ENV}={forced!r}: the one value is 'torch' (unset: vLLM picks the path)")
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU] = SiluAndMul.forward_native
    cls = cpu_fused_moe.CPUFusedMOE
    if getattr(cls, "_recipes_wrapped", False):
        return
    native_check = cls.check_grouped_gemm
    logger = logging.getLogger("vllm")
    seen: set[str] = set()

    def check_grouped_gemm(self, layer):
        use_grouped_gemm, isa = (False, "none") if forced == "torch" else native_check(self, layer)
        path = f"grouped_gemm ({isa})" if use_grouped_gemm else "forward_torch"
        if path not in seen:
            seen.add(path)
            why = f" ({FORCE_ENV}=torch)" if forced else ""
            logger.warning("recipes: vLLM CPU MoE path %s%s", path, why)
        return use_grouped_gemm, isa

    cls.check_grouped_gemm = check_grouped_gemm
    cls._recipes_wrapped = True
