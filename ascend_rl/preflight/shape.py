"""The Megatron shape a launch asks for, checked against megatron-core's own rules before Ray starts.

What megatron-core refuses only once every rank builds its model (the pipeline split of the decoder layers, the
activation recompute settings, experts that do not divide over EP) is refused here in one line, in megatron-core's
own words, with the setting that fixes it (ascend_rl/megatron_layout.py; `python3 -m ascend_rl shape_check` builds
every rank class to confirm). Arithmetic only: nothing is imported from megatron.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from ascend_rl import megatron_layout, memory_plan
from ascend_rl.preflight.report import Check


def check_megatron_shape(cfg, recipe: str | None = None, base: str | None = None) -> Check:
    """The launch's Megatron layout against the model's layer and expert counts."""
    if OmegaConf.select(cfg, "actor_rollout_ref.actor.strategy", default=None) != "megatron":
        return Check("megatron", "skipped", "the actor is not Megatron's")
    s = memory_plan.settings_from_config(cfg, recipe, base)
    try:
        model, _ = memory_plan.model_config(s.get("actor_rollout_ref.model.path"))
    except (ValueError, OSError) as exc:
        return Check("megatron", "skipped", f"no model config to check the layout against: {exc}")
    return shape_problem_check(s, model)


def shape_problem_check(s, model) -> Check:
    """The Check for settings `s` (memory_plan's settings) and a model config.json dict."""
    layers = int(model.get("num_hidden_layers") or 0)
    experts = int(model.get("n_routed_experts") or model.get("num_experts") or 0)
    m = "actor_rollout_ref.actor.megatron."
    tp, pp, ep = (
        int(s.get(m + k) or 1)
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")
    )
    try:
        split = megatron_layout.pipeline_split(s, layers)
        rc = megatron_layout.recompute(s)
    except megatron_layout.LayoutError as exc:
        return Check("megatron", "FAIL", f"megatron-core refuses the layout: {exc.message}; {exc.fix}")
    if experts and experts % ep:
        # megatron-core 0.16.1's MoELayer asserts it bare (moe_layer.py:101)
        return Check(
            "megatron",
            "FAIL",
            f"megatron-core refuses the layout: {experts} experts do not divide over expert_model_parallel_size "
            f"{ep} (moe_layer.py:101 asserts num_moe_experts % ep_size == 0); set an EP that divides {experts}",
        )
    heads = int(model.get("num_attention_heads") or 0)
    if heads and heads % tp:
        return Check(
            "megatron",
            "FAIL",
            f"megatron-core refuses the layout: {heads} attention heads do not divide over "
            f"tensor_model_parallel_size {tp}; set a TP that divides {heads}",
        )
    what = f"{layers} layers over PP{pp}: {list(split)}"
    if rc.granularity:
        what += f"; recompute {rc.granularity}" + (
            f" {rc.method} {rc.num_layers} (layers recomputed per stage: "
            f"{[rc.layers_recomputed(n) for n in split]})"
            if rc.granularity == "full"
            else ""
        )
    else:
        what += "; no activation recompute"
    return Check("megatron", "ok", what)
