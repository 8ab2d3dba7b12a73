"""The pipeline split and the activation recompute a launch hands Megatron (ascend_rl/megatron_layout.py): one reader
for the memory plan, the dry run's megatron line and the shape check. megatron-core's own refusals of the same
settings are built in tests/harness/test_shape_check_091.py, which asserts these messages are its words."""

from __future__ import annotations

import pytest

from ascend_rl import megatron_layout as ml
from ascend_rl import memory_plan as mp
from ascend_rl.preflight.shape import shape_problem_check

ORIGINAL = "Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttL"


def _s(pp=8, mcore="0.16.1", **otc) -> dict:
    out = {ml.PP_KEY: pp, "_megatron_core": mcore}
    out.update({ml.OTC + k: v for k, v in otc.items()})
    return out


def test_61_layers_over_8_stages_without_a_split_are_refused_with_megatrons_words_and_the_fix():
    with pytest.raises(ml.LayoutError) as caught:
        ml.pipeline_split(_s(), 61)
    assert caught.value.message == ml.MCORE_EVEN_SPLIT
    # megatron-core 0.16.1: the layout string the original's split is; 0.12.1: the end stages' counts
    assert f"pipeline_model_parallel_layout={ORIGINAL!r}" in caught.value.fix
    with pytest.raises(ml.LayoutError) as old:
        ml.pipeline_split(_s(mcore="0.12.1"), 61)
    assert old.value.fix == "set num_layers_in_first_pipeline_stage=7 num_layers_in_last_pipeline_stage=6"
    assert ml.pipeline_split(_s(), 64) == (8,) * 8  # an even split needs nothing


def test_the_originals_split_is_the_balanced_one_and_reads_back_from_its_string():
    assert ml.balanced_split(61, 8) == (7, 7, 8, 8, 8, 8, 8, 7)
    assert ml.layout_string((7, 7, 8, 8, 8, 8, 8, 7)) == ORIGINAL
    assert ml.pipeline_split(_s(pipeline_model_parallel_layout=ORIGINAL), 61) == (7, 7, 8, 8, 8, 8, 8, 7)
    # megatron-core's shorthand: x*n, (...)*n and cosmetic commas
    assert ml.pipeline_split(_s(pipeline_model_parallel_layout="Et*7|t*7|(t*8|)*5,t*7L"), 61) == (
        7, 7, 8, 8, 8, 8, 8, 7,
    )  # fmt: skip


@pytest.mark.parametrize(
    "layout,words",
    [
        ("Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|ttttttttL", "stages, not a multiple"),
        ("Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|ttttttt", "exactly once"),
        ("Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|ttttttL", "must match num_layers 61"),
        (
            "Ettttttt|ttxtttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttL",
            "Invalid layer character: x",
        ),
    ],
)
def test_a_wrong_layout_string_is_refused(layout, words):
    with pytest.raises(ml.LayoutError, match=words):
        ml.pipeline_split(_s(pipeline_model_parallel_layout=layout), 61)


def test_end_stage_counts_follow_megatrons_rule_and_a_layout_string_is_refused_on_0_12():
    assert ml.pipeline_split(_s(mcore="0.12.1", num_layers_in_first_pipeline_stage=7,
                                num_layers_in_last_pipeline_stage=6), 61) == (7, 8, 8, 8, 8, 8, 8, 6)  # fmt: skip
    with pytest.raises(ml.LayoutError, match="number of layers at middle stage: 47 must be divisible"):
        ml.pipeline_split(_s(num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7), 61)
    with pytest.raises(ml.LayoutError, match="larger than 0"):
        ml.pipeline_split(_s(num_layers_in_first_pipeline_stage=0), 61)
    # verl 0.6.0 / 0.7.1's converter drops the key with a warning (tests/harness/test_shape_check_012.py builds it):
    # refused, since the launch would build another split than it names
    with pytest.raises(
        ml.LayoutError, match="has no pipeline_model_parallel_layout: verl's converter drops it"
    ):
        ml.pipeline_split(_s(mcore="0.12.1", pipeline_model_parallel_layout=ORIGINAL), 64)


def test_recompute_block_8_recomputes_every_layer_of_the_launchs_stages_and_megatrons_refusals():
    rc = ml.recompute(_s(recompute_granularity="full", recompute_method="block", recompute_num_layers=8))
    assert [rc.layers_recomputed(n) for n in (7, 7, 8, 8, 8, 8, 8, 7)] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert ml.recompute(_s(recompute_granularity="full", recompute_method="block", recompute_num_layers=3)) \
        .layers_recomputed(8) == 3  # fmt: skip
    assert ml.recompute(_s()).layers_recomputed(8) == 0
    with pytest.raises(ml.LayoutError, match='recompute_method must be "block" or "uniform"'):
        ml.recompute(_s(recompute_granularity="full"))
    with pytest.raises(ml.LayoutError, match="recompute_num_layers must be between"):
        ml.recompute(_s(recompute_granularity="full", recompute_method="block"))
    with pytest.raises(ml.LayoutError, match="must be None"):
        ml.recompute(_s(recompute_granularity="selective", recompute_num_layers=2))


def _launch(**extra) -> dict:
    """The DeepSeek launch's Megatron settings (256 dies, TP4 PP8 EP8; test_plan_memory's original layout) with no
    pipeline split but `extra`'s override_transformer_config."""
    from test_plan_memory import _original

    s = _original("alltoallv")
    del s[ml.LAYOUT_KEY]
    s.update({ml.OTC + k: v for k, v in extra.items()})
    return s


def test_the_plan_takes_its_per_stage_terms_from_the_split_megatron_is_told():
    cfg, _ = mp.model_config(None, "deepseek-r1")
    original = mp.plan(_launch(pipeline_model_parallel_layout=ORIGINAL), cfg, mp.DIES["A3"])
    stages = original.stage_plans
    weights = [p.rank_terms[st * 32]["weights"] for st, p in enumerate(stages)]
    # stages 2-6 hold 8 MoE layers each, 1 and 7 seven; stage 0 three dense + four MoE and the embedding
    assert weights[2:7] == [weights[2]] * 5 and weights[1] < weights[2] and weights[7] < weights[2]
    # one layer moved from stage 1 to stage 2 moves one MoE layer's bytes between their terms
    moved = mp.plan(
        _launch(
            pipeline_model_parallel_layout=ORIGINAL.replace("|ttttttt|tttttttt|", "|tttttt|ttttttttt|", 1)
        ),
        cfg,
        mp.DIES["A3"],
    )
    w2 = [p.rank_terms[st * 32]["weights"] for st, p in enumerate(moved.stage_plans)]
    assert w2[1] < weights[1] and w2[2] > weights[2] and w2[1] + w2[2] == weights[1] + weights[2]
    # no split: the plan refuses as megatron-core does
    with pytest.raises(ml.LayoutError):
        mp.plan(_launch(), cfg, mp.DIES["A3"])


def test_the_plans_update_activations_follow_the_recompute():
    cfg, _ = mp.model_config(None, "deepseek-r1")
    s = _launch(pipeline_model_parallel_layout=ORIGINAL)

    def update_act(**rc) -> int:
        plan = mp.plan({**s, **{ml.OTC + k: v for k, v in rc.items()}}, cfg, mp.DIES["A3"], stage=2)
        return next(t.nbytes for ph in plan.phases for t in ph.terms if t.name == "activations (update)")

    none, all8 = update_act(), update_act(recompute_granularity="full", recompute_method="block",
                                           recompute_num_layers=8)  # fmt: skip
    half = update_act(recompute_granularity="full", recompute_method="block", recompute_num_layers=4)
    assert all8 < half < none


def test_quoted_hydra_values_from_a_dry_run_plan_are_read_unquoted():
    s = mp.settings_from_plan({"overrides": {ml.LAYOUT_KEY: f"'{ORIGINAL}'"}, "verl": {"version": "0.9.1"}})
    assert s[ml.LAYOUT_KEY] == ORIGINAL and s["_megatron_core"] == "0.16.1"


def test_the_dry_runs_megatron_line():
    cfg, _ = mp.model_config(None, "deepseek-r1")
    ok = shape_problem_check(_launch(pipeline_model_parallel_layout=ORIGINAL), cfg)
    assert ok.status == "ok" and "[7, 7, 8, 8, 8, 8, 8, 7]" in ok.detail
    refused = shape_problem_check(_launch(), cfg)
    assert refused.status == "FAIL" and ml.MCORE_EVEN_SPLIT in refused.detail and ORIGINAL in refused.detail
    ep = shape_problem_check(
        {
            **_launch(pipeline_model_parallel_layout=ORIGINAL),
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 3,
        },
        cfg,
    )
    assert ep.status == "FAIL" and "256 experts do not divide over expert_model_parallel_size 3" in ep.detail
