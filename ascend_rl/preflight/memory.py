"""The launch's per-die memory plan (ascend_rl/memory_plan.py) against its die, as one check."""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from ascend_rl import memory_plan
from ascend_rl.preflight.report import Check

# The plan is arithmetic from the launch settings, not a measurement on a die: a user whose launch the plan refuses
# but who knows it fits (a memory feature the plan does not model) sets this to "warn" and launches.
MEMORY_OVERRIDE = "RECIPES_MEMORY_PLAN"


def check_memory(cfg, recipe: str, cpu: bool = False, base: str | None = None):
    """(Check, plan or None): the per-die memory plan of the launch's GRPO step against its die, less the
    headroom (ascend_rl/memory_plan.py), on its verl base (`base`: its version; the workers and the KV-cache rule
    differ by base). The CPU profile has no die: it is not planned (its memory is the host's)."""
    device = OmegaConf.select(cfg, "trainer.device", default=None)
    if cpu or device != "npu":
        return Check("memory", "skipped", f"trainer.device={device}: no NPU die to plan against"), None
    try:
        plan = memory_plan.plan_launch(memory_plan.settings_from_config(cfg, recipe, base))
    except (ValueError, KeyError, IndexError, OSError, ArithmeticError) as exc:
        # a layout the other checks refuse (NNODES that does not divide the devices) cannot be planned either
        return Check("memory", "skipped", f"not planned: {type(exc).__name__}: {exc}"), None
    refusal = plan.refusal()
    if refusal and os.environ.get(MEMORY_OVERRIDE) == "warn":
        return Check("memory", "warn", f"{refusal}; launching anyway ({MEMORY_OVERRIDE}=warn)"), plan
    if refusal:
        return Check("memory", "FAIL", f"{refusal}; {MEMORY_OVERRIDE}=warn launches anyway"), plan
    peak = plan.peak
    return (
        Check(
            "memory",
            "ok",
            f"planned peak {peak.total / memory_plan.GIB:.1f} GiB per die in {peak.name}, of "
            f"{plan.die.memory / memory_plan.GIB:.0f} GiB ({plan.die.name}) less {plan.headroom / memory_plan.GIB:.1f} "
            "GiB headroom",
        ),
        plan,
    )
