"""The per-die memory plan (ascend_rl/memory_plan.py, `python3 -m ascend_rl plan_memory`) and its use by the
preflight: figures worked out by hand for small models, the original's reshard increment at its layout, the
one-line refusal and the dry run's print. Fast: no launcher, no verl tree, no torch."""

from __future__ import annotations

import json

import pytest

from ascend_rl import memory_plan as mp
from ascend_rl import moe_reshard as mr
from ascend_rl.cli import plan_memory as cli
from ascend_rl.paths import RECIPES
from llm_rl.deepseek_r1 import bench_reshard

# A Qwen2-shaped toy: hidden 8, FFN 16, 2 layers, 2 heads of 4 (1 KV head), vocab 32, tied embeddings.
TINY_QWEN = {
    "model_type": "qwen2",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "tie_word_embeddings": True,
}
# By hand, per layer: norms 8 + 8, q 8x8 + 8, k 4x8 + 4, v 4x8 + 4, o 8x8, gate/up 32x8, down 8x16 = 608;
# two layers 1216, embedding 32x8 = 256, final norm 8.
TINY_QWEN_PARAMS = 1480
# vLLM pads the vocabulary to a multiple of 64: its embedding is 64 x 8, 256 values more than the checkpoint's
TINY_QWEN_VLLM = TINY_QWEN_PARAMS + (64 - 32) * 8

# A DeepSeek-V3-shaped toy: layer 0 dense, layer 1 MoE with 4 routed experts of FFN 4 and one shared expert.
TINY_DS = {
    "model_type": "deepseek_v3",
    "hidden_size": 8,
    "intermediate_size": 16,
    "moe_intermediate_size": 4,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "num_attention_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 4,
    "qk_nope_head_dim": 2,
    "qk_rope_head_dim": 2,
    "v_head_dim": 2,
    "vocab_size": 16,
    "tie_word_embeddings": False,
}
# By hand: embedding 128; layer 0: norms 8 + 8, q 8x8, kv_a 6x8, kv_a norm 4, kv_b 8x4, o 8x4, gate/up 32x8,
# down 8x16 = 580; layer 1: the same attention 196, router 4x8 + bias 4, shared gate/up 8x8, shared down 8x4
# = 328; final norm 8; lm_head 128. Routed experts: w1 8x8 + w2 8x4 = 96 each.
TINY_DS_DENSE = 1172
TINY_DS_EXPERT = 96

DIE = mp.Die("test die", 2**20, "a test")
QWEN_SINGLE = RECIPES / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"


def _settings(**kw) -> dict:
    out = dict(mp.DEFAULTS)
    out.update({k.replace("__", "."): v for k, v in kw.items()})
    return out


def _fsdp(**kw) -> dict:
    base = {
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 2,
        "trainer.device": "npu",
        "data.max_prompt_length": 8,
        "data.max_response_length": 8,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
        "actor_rollout_ref.rollout.max_num_batched_tokens": 16,
        "actor_rollout_ref.rollout.max_num_seqs": 4,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    }
    base.update(kw)
    return _settings(**base)


def _terms(phase: mp.Phase) -> dict[str, int]:
    return {t.name: t.nbytes for t in phase.terms}


def _phase(plan: mp.Plan, name: str) -> mp.Phase:
    return next(p for p in plan.phases if p.name == name)


def test_dense_model_by_hand_fsdp_over_two_dies():
    sh = mp.shapes(TINY_QWEN)
    assert mp.total_params(sh) == TINY_QWEN_PARAMS
    plan = mp.plan(_fsdp(), TINY_QWEN, DIE)
    per_die = TINY_QWEN_PARAMS // 2  # FSDP shards every weight over the 2 dies: 740 params
    update = _terms(_phase(plan, "actor update"))
    assert update["actor weights"] == per_die * 4  # fp32 actor (verl's model_dtype default)
    assert update["actor gradients"] == per_die * 4
    assert update["optimizer states"] == per_die * 8  # AdamW m and v in fp32
    gen = _terms(_phase(plan, "generation"))
    assert gen["rollout weights"] == TINY_QWEN_VLLM * 2  # the whole model in bf16 at rollout TP1
    # vLLM-Ascend: 0.5 x the die, less the engine's weights, its profile peak and the actor already there. The profile
    # estimate: 16 tokens x (8 x 8 + 3 x 16) x 2 B, plus the sampler's 4 x 32 fp32 logits.
    profile = 16 * (8 * 8 + 3 * 16) * 2 + 4 * 32 * 4
    assert gen["rollout activations"] == profile
    kv = 2**19 - TINY_QWEN_VLLM * 2 - profile - per_die * 4
    assert gen["KV cache"] == kv
    # one token of one layer: K and V, 1 head of 4, bf16 = 16 B; 2 layers; blocks of 128 tokens
    assert plan.kv_bytes_per_token == 32
    assert dict(plan.facts)["KV cache"].endswith(f"= {kv // (32 * 128)} blocks of 128 tokens")
    # the generation holds vLLM's whole budget plus what arrived after the engine started: Adam's states
    assert _phase(plan, "generation").total == 2**19 + per_die * 8
    assert "reference weights" not in gen  # offloaded


@pytest.mark.parametrize(
    "base, ranks",
    [
        # verl 0.7.1's fsdp_workers pass fully_shard a shard_placement_fn: the first dim 2 divides, so the
        # 33 x 8 embedding splits on hidden (132 values a rank) and nothing is padded
        ("0.7.1", {0: (744, 744), 1: (744, 744)}),
        # verl 0.9.1's FSDP engine passes none: dim 0, 17 + 16 rows, each shard stored padded to 17 rows
        ("0.9.1", {0: (748, 748), 1: (748, 740)}),
    ],
)
def test_an_odd_vocabulary_splits_where_the_bases_fsdp2_placement_puts_it(base, ranks):
    """A vocabulary 2 ranks do not divide (the CPU runs' Qwen2-faithful tiny tokenizer has 605 tokens): each
    rank's (stored, Adam-state) values by hand. Every other tensor of TINY_QWEN has an even dim 0: 612 a rank."""
    odd = dict(TINY_QWEN, vocab_size=33)
    plan = mp.plan(_fsdp(_verl=base, **{"actor_rollout_ref.actor.strategy": "fsdp2"}), odd, DIE)
    for rank, (stored, adam) in ranks.items():
        terms = mp.measured_terms(plan, rank=rank)
        assert (terms["weights"], terms["gradients"], terms["optimizer_states"]) == (
            stored * 4,
            stored * 4,
            2 * adam * 4,
        ), (base, rank, terms)


def test_rollout_tensor_parallel_splits_by_hand():
    plan = mp.plan(_fsdp(**{"actor_rollout_ref.rollout.tensor_model_parallel_size": 2}), TINY_QWEN, DIE)
    # TP2: embedding (padded to 64 rows) 256; per layer norms 16, q 32 + 4, k 16 + 2, v 16 + 2, o 32, gate/up 128,
    # down 64; final norm 8
    assert _terms(_phase(plan, "generation"))["rollout weights"] == (256 + 2 * 312 + 8) * 2


def test_offloads_move_the_state_off_the_die():
    kept = mp.plan(_fsdp(), TINY_QWEN, DIE)
    off = mp.plan(
        _fsdp(
            **{
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
                "actor_rollout_ref.actor.fsdp_config.param_offload": True,
            }
        ),
        TINY_QWEN,
        DIE,
    )
    assert "optimizer states" in _terms(_phase(kept, "generation"))
    assert "optimizer states" not in _terms(_phase(off, "generation"))
    assert "actor weights" not in _terms(_phase(off, "generation"))
    assert _phase(off, "onload actor").moved == 740 * (
        4 + 8
    )  # weights and Adam; FSDP makes its gradients anew
    assert _phase(off, "actor update").total == _phase(kept, "actor update").total


def _megatron(**kw) -> dict:
    base = {
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 4,
        "trainer.device": "npu",
        "actor_rollout_ref.actor.strategy": "megatron",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 2,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.data_parallel_size": 4,
        "actor_rollout_ref.rollout.expert_parallel_size": 4,
        "actor_rollout_ref.rollout.expert_reshard": "alltoallv",
        "actor_rollout_ref.rollout.explicit_offload": True,
    }
    base.update(kw)
    return _settings(**base)


def test_moe_model_by_hand_with_the_distributed_optimizer():
    sh = mp.shapes(TINY_DS)
    assert mp.total_params(sh) == TINY_DS_DENSE + 4 * TINY_DS_EXPERT
    plan = mp.plan(_megatron(), TINY_DS, DIE)
    update = _terms(_phase(plan, "actor update"))
    # TP1 PP1: every dense weight but the router's bias (megatron-core keeps it as a buffer): 1168 values, in
    # megatron-core's order embedding 128 | layer 0: norm 8, o 32, q 64, kv_a 48, kv_b 32, kv_a norm 4, norm 8,
    # gate/up 256, down 128 | layer 1: the same attention 196, router 32, shared gate/up 64, shared down 32 | norm 8,
    # lm_head 128. The DDP buffer lays them out in reverse, each from a multiple of 64: 1792 values, already a
    # multiple of lcm(DP 4, 128). EP2: 2 of the 4 experts (w1 64, w2 32 each): 32, 64, 32, 64 at 0, 64, 128, 192,
    # 256 values.
    dense_sizes, expert_sizes = mp.mcore_params(mp.shapes(TINY_DS), 1, 0, mr.TrainLayout(4, ep=2))
    assert sum(dense_sizes) == TINY_DS_DENSE - 4 and sum(expert_sizes) == 2 * TINY_DS_EXPERT
    assert update["actor weights"] == (1792 + 256) * 2  # bf16 param buffers
    assert update["actor gradients"] == (1792 + 256) * 4  # Megatron's fp32 grad buffers, not sharded
    # fp32 main weights + Adam m, v = 12 B per value each DP rank owns: its quarter of the dense buffer (448 values
    # from lm_head down, less the padding in it: 272, 252, 332, 312) and its half of the expert one (96 each)
    owned = {0: 272 + 96, 1: 252 + 96, 2: 332 + 96, 3: 312 + 96}
    assert {r: t["optimizer_states"] for r, t in plan.rank_terms.items()} == {
        r: 12 * n for r, n in owned.items()
    }
    assert update["optimizer states"] == 12 * 428  # the die's term: the rank that holds most
    # rollout EP4: one expert each, dense whole at TP1, in bf16 but the router's fp32 bias (4 values); the embedding
    # and the LM head padded from 16 to 64 rows of 8
    vllm_dense = TINY_DS_DENSE + 2 * (64 - 16) * 8
    assert (
        _terms(_phase(plan, "generation"))["rollout weights"] == (vllm_dense - 4 + TINY_DS_EXPERT) * 2 + 4 * 4
    )
    # the AlltoAllV moves one w1 expert (8x8 bf16) to each die; the all-gather all 4
    sync = _terms(_phase(plan, "weight sync and reshard"))
    assert sync["reshard buffer, routed experts"] == 8 * 8 * 2
    gathered = mp.plan(_megatron(**{"actor_rollout_ref.rollout.expert_reshard": "allgather"}), TINY_DS, DIE)
    assert (
        _terms(_phase(gathered, "weight sync and reshard"))["reshard buffer, routed experts"] == 4 * 8 * 8 * 2
    )


def _original(method: str) -> dict:
    """The original's reshard layout: 256 dies, training TP4 EP8 PP8 (its layers [7,7,8,8,8,8,8,7]), rollout EP256
    (the launcher's --variant random)."""
    return _settings(
        **{
            "actor_rollout_ref.actor.megatron.override_transformer_config.pipeline_model_parallel_layout": (
                "Ettttttt|ttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttL"
            ),
            "_megatron_core": "0.16.1",  # a megatron-core that can write the original's split (0.14+)
            "trainer.nnodes": 16,
            "trainer.n_gpus_per_node": 16,
            "trainer.device": "npu",
            "actor_rollout_ref.actor.strategy": "megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 4,
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 8,
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 8,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
            "actor_rollout_ref.rollout.data_parallel_size": 128,
            "actor_rollout_ref.rollout.expert_parallel_size": 256,
            "actor_rollout_ref.rollout.expert_reshard": method,
            "actor_rollout_ref.rollout.explicit_offload": True,
        }
    )


@pytest.mark.parametrize("method,gib", [("alltoallv", 0.0547), ("allgather", 14.0)])
def test_the_originals_reshard_increment_at_its_layout(method, gib):
    cfg, _ = mp.model_config(None, "deepseek-r1")
    plan = mp.plan(_original(method), cfg, mp.DIES["A3"], stage=1)
    extra = _terms(_phase(plan, "weight sync and reshard"))["reshard buffer, routed experts"]
    assert round(extra / mp.GIB, 4) == gib
    # the same figure bench_reshard prints (moe_reshard's planner, not a second derivation)
    train = mr.TrainLayout(256, tp=4, ep=8, pp=8)
    _, rows = bench_reshard.expert_rows(train, mr.RolloutLayout(256, ep=256), mr.deepseek_v3_spec())
    peak_row = next(r for r in rows if "peak extra" in r[0])
    assert peak_row[2 if method == "alltoallv" else 1] == f"{gib:.4f}"


def test_the_shipped_deepseek_table_is_moe_reshards_deepseek_v3():
    cfg, source = mp.model_config(None, "deepseek-r1")
    assert mp.shapes(cfg).spec == mr.deepseek_v3_spec()
    assert "config.json" in source
    assert 670e9 < mp.total_params(mp.shapes(cfg)) < 672e9  # DeepSeek-R1: 671B without the MTP layer
    qwen, _ = mp.model_config(None, "qwen2.5-1.5b")
    assert round(mp.total_params(mp.shapes(qwen)) / 1e9, 2) == 1.54


def test_a_model_folder_without_config_json_falls_back_to_the_table_by_name(tmp_path):
    _, source = mp.model_config(str(tmp_path / "Qwen2_5_1_5B_Instruct"))
    assert "shipped table" in source
    with pytest.raises(ValueError, match="no config.json"):
        mp.model_config(str(tmp_path / "my-model"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY_QWEN))
    cfg, source = mp.model_config(str(tmp_path / "m"))
    assert cfg == TINY_QWEN and source.endswith("config.json")


def test_a_peak_over_the_die_is_refused_in_one_line_naming_phase_and_term():
    small = mp.Die("small die", 40_000, "a test")
    plan = mp.plan(_fsdp(), TINY_QWEN, small)
    line = plan.refusal()
    assert line is not None and "\n" not in line
    peak = plan.peak
    assert f"phase '{peak.name}'" in line and peak.largest().name in line
    roomy = mp.plan(_fsdp(), TINY_QWEN, mp.Die("big die", 16 * 2**30, "a test"))
    assert roomy.refusal() is None


def test_a_rollout_kept_through_training_is_refused_with_the_explicit_offload_as_the_fix():
    """On several NPU nodes without the explicit offload the plan keeps the rollout on the die through training;
    when that tips the update over the die, the line says so, not "lower gpu_memory_utilization"."""
    kept = _engine(
        **{
            "trainer.nnodes": 2,
            "trainer.n_gpus_per_node": 2,
            "actor_rollout_ref.rollout.explicit_offload": False,
            "actor_rollout_ref.rollout.max_num_batched_tokens": 16,
            "actor_rollout_ref.rollout.max_num_seqs": 4,
            "actor_rollout_ref.actor.megatron.param_offload": True,
            "actor_rollout_ref.actor.megatron.optimizer_offload": True,
        }
    )
    plan = mp.plan(kept, TINY_DS, DIE)
    line = plan.refusal()
    assert plan.peak.name != "generation" and plan.peak.largest().name in ("KV cache", "rollout weights")
    assert "explicit_offload=True" in line and "gpu_memory_utilization" not in line
    at_generation = mp.plan(_fsdp(), TINY_QWEN, mp.Die("small die", 40_000, "a test"))
    assert at_generation.peak.name == "generation"
    assert "gpu_memory_utilization" in at_generation.refusal()


def _cfg(settings: dict, model: str):
    from omegaconf import OmegaConf

    nested: dict = {}
    for key, value in settings.items():
        node = nested
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    nested["actor_rollout_ref"]["model"] = {"path": model}
    return OmegaConf.create(nested)


def test_the_preflight_refuses_over_the_die_and_skips_the_cpu_profile(tmp_path):
    from ascend_rl import preflight

    (tmp_path / "m").mkdir()
    big = dict(TINY_QWEN, hidden_size=8192, intermediate_size=32768, num_hidden_layers=48, vocab_size=151936)
    (tmp_path / "m" / "config.json").write_text(json.dumps(big))
    settings = _fsdp(**{"trainer.n_gpus_per_node": 1})
    check, plan = preflight.check_memory(_cfg(settings, str(tmp_path / "m")), "qwen2_5")
    assert check.status == "FAIL" and plan is not None
    assert check.detail.startswith(plan.refusal()) and "Atlas A2" in check.detail and "\n" not in check.detail
    assert check.detail.endswith("RECIPES_MEMORY_PLAN=warn launches anyway")
    check, plan = preflight.check_memory(_cfg(settings, str(tmp_path / "m")), "qwen2_5", cpu=True)
    assert (check.status, plan) == ("skipped", None)
    cpu = _cfg(dict(settings, **{"trainer.device": "cpu"}), str(tmp_path / "m"))
    assert preflight.check_memory(cpu, "qwen2_5")[0].status == "skipped"
    assert "memory" in preflight.MACHINE_CHECKS  # a dry run shows it as a warning, a launch stops


def test_the_memory_refusal_becomes_a_warning_only_when_the_user_says_so(tmp_path, monkeypatch):
    from ascend_rl import preflight

    (tmp_path / "m").mkdir()
    big = dict(TINY_QWEN, hidden_size=8192, intermediate_size=32768, num_hidden_layers=48, vocab_size=151936)
    (tmp_path / "m" / "config.json").write_text(json.dumps(big))
    cfg = _cfg(_fsdp(**{"trainer.n_gpus_per_node": 1}), str(tmp_path / "m"))
    monkeypatch.setenv("RECIPES_MEMORY_PLAN", "yes")  # anything but "warn" keeps the refusal
    assert preflight.check_memory(cfg, "qwen2_5")[0].status == "FAIL"
    monkeypatch.setenv("RECIPES_MEMORY_PLAN", "warn")
    check, plan = preflight.check_memory(cfg, "qwen2_5")
    assert (
        check.status == "warn"
        and check.detail.startswith(plan.refusal())
        and "launching anyway" in check.detail
    )


def _plan_json(version: str, **overrides: str) -> dict:
    return {
        "recipe": "qwen2_5",
        "config_name": "ppo_trainer",
        "verl": {"version": version},
        "overrides": overrides,
    }


def test_a_0_9_1_launch_reads_its_base_defaults_and_the_checkpoint_engines_bucket():
    """verl 0.9.1's config: the sync's bucket under rollout.checkpoint_engine (2048 MB by default), server-mode
    rollout and 256 sequences by default; its FSDP actor runs in the engine workers, its KV cache by vLLM-Ascend
    0.23's rule. 0.7.1 keeps vLLM-Ascend 0.13's and the worker path it had."""
    r = "actor_rollout_ref.rollout."
    s = mp.settings_from_plan(_plan_json("0.9.1"))
    assert (s[r + "update_weights_bucket_megabytes"], s[r + "mode"], s[r + "max_num_seqs"]) == (
        2048,
        "async",
        256,
    )
    assert mp.engine_workers(s) and mp.vllm_ascend(s) == "0.23.0.post1"
    s = mp.settings_from_plan(
        _plan_json("0.9.1", **{r + "checkpoint_engine.update_weights_bucket_megabytes": "512"})
    )
    assert s[r + "update_weights_bucket_megabytes"] == 512
    old = mp.settings_from_plan(_plan_json("0.7.1"))
    assert (old[r + "update_weights_bucket_megabytes"], old[r + "max_num_seqs"]) == (2048, 1024)
    assert not mp.engine_workers(old) and mp.vllm_ascend(old) == "0.13.0"
    assert mp.vllm_ascend(mp.settings_from_plan({"overrides": {}})) == "0.13.0"  # no base named: 0.6.0's
    # the preflight's composed config, on the base it is handed
    cfg = _cfg(_fsdp(), "/nowhere")
    assert mp.engine_workers(mp.settings_from_config(cfg, "qwen2_5", "0.9.1"))
    assert not mp.engine_workers(mp.settings_from_config(cfg, "qwen2_5", "0.7.1"))
    megatron = mp.settings_from_plan({"config_name": "ppo_megatron_trainer", "verl": {"version": "0.9.1"}})
    assert not mp.engine_workers(megatron)  # the FSDP engine's layout only


def test_on_0_9_1_the_kv_cache_leaves_out_the_actor_and_the_reference_stays_on_the_host():
    """vLLM-Ascend 0.23's rule: the share of the die less the engine's own weights and profile peak, whatever the
    actor holds when the engine starts (0.13's subtracts it); the forward-only reference engine is host-offloaded
    even with ref param_offload=False, only its root module and two layers on the die in its forward."""
    kw = {"actor_rollout_ref.ref.fsdp_config.param_offload": False}
    old = mp.plan(_fsdp(_verl="0.7.1", **kw), TINY_QWEN, DIE)
    new = mp.plan(_fsdp(_verl="0.9.1", **kw), TINY_QWEN, DIE)
    per_die = TINY_QWEN_PARAMS // 2
    profile = 16 * (8 * 8 + 3 * 16) * 2 + 4 * 32 * 4
    gen_old, gen_new = _terms(_phase(old, "generation")), _terms(_phase(new, "generation"))
    assert gen_new["KV cache"] == 2**19 - TINY_QWEN_VLLM * 2 - profile
    # 0.13: less the fp32 actor shard and the bf16 reference shard on the die at the engine's start
    assert gen_old["KV cache"] == gen_new["KV cache"] - per_die * 4 - per_die * 2
    assert "reference weights" in gen_old and "reference weights" not in gen_new
    # the reference's forward: the root (embedding 32 x 8, final norm 8) and two layers of 608, whole, bf16
    ref = next(t for t in _phase(new, "reference forward").terms if t.name == "reference weights")
    assert ref.nbytes == (256 + 8 + 2 * 608) * 2 and ref.estimate
    assert "vLLM-Ascend 0.23.0.post1" in dict(new.facts)["KV rule"]
    # the measured terms are the same layout on both bases
    assert mp.measured_terms(new) == mp.measured_terms(old)


def test_on_0_9_1_offloaded_fsdp2_weights_stream_to_the_sync():
    """The FSDP engine's FSDP2 export leaves offloaded actor weights on the host and copies each tensor's shard to
    the die as the sync takes it; 0.7.1 onloads them for the sync and offloads them before the KV cache."""
    kw = {
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    }
    new = mp.plan(_fsdp(_verl="0.9.1", **kw), TINY_QWEN, DIE)
    old = mp.plan(_fsdp(_verl="0.7.1", **kw), TINY_QWEN, DIE)
    sync_new = _terms(_phase(new, "weight sync and reshard"))
    sync_old = _terms(_phase(old, "weight sync and reshard"))
    assert "actor weights" not in sync_new and "actor weights" in sync_old
    # the largest tensor, the 32 x 8 embedding: its shard of 16 rows copied from the host (fp32), gathered, bf16 copy
    assert sync_new["reshard buffer, dense"] == 16 * 8 * 4 + 256 * 4 + 256 * 2
    assert sync_old["reshard buffer, dense"] == 256 * 4 + 256 * 2
    assert _phase(new, "onload KV cache").moved == 0
    assert _phase(old, "onload KV cache").moved == sync_old["actor weights"]
    # without the offload the weights stay on the die on both
    kept = mp.plan(_fsdp(_verl="0.9.1", **{"actor_rollout_ref.actor.strategy": "fsdp2"}), TINY_QWEN, DIE)
    assert "actor weights" in _terms(_phase(kept, "weight sync and reshard"))


def _engine(**kw) -> dict:
    """_megatron's 4 dies, TP1 EP2, on verl 0.9.1: the Megatron engine's layout (memory_plan.megatron_engine)."""
    return _megatron(_verl="0.9.1", **kw)


def test_on_0_9_1_the_megatron_actor_is_the_engines_and_0_7_1s_the_workers():
    assert mp.megatron_engine(_engine()) and not mp.megatron_engine(_megatron(_verl="0.7.1"))
    assert not mp.megatron_engine(_fsdp(_verl="0.9.1"))
    s = mp.settings_from_plan({"config_name": "ppo_megatron_trainer", "verl": {"version": "0.9.1"}})
    assert mp.megatron_engine(s)


@pytest.mark.parametrize(
    "kw, allgather, alltoallv",
    [
        # rollout EP4: every die keeps one expert. The bridge all-gathers one local expert's w1 (8x8 bf16, 128 B)
        # over EP2: 2 x 128 (0.7.1's per_tensor_generator: all 4 experts of the layer, 512). ds-0206's call for
        # local id 0: rank 2 receives expert 2 from rank 1, one w1 (the same as the layer's figure here)
        ({}, 2 * 128, 128),
        # rollout EP off: every die keeps all 4. A call (local id 0) moves experts 0 and 2 to every die: rank 0
        # receives its own expert 0 and expert 2 (256) and sends expert 0 to itself and to rank 1, packed (256):
        # 512, where the layer's figure (both local ids at once) is 1024
        ({"actor_rollout_ref.rollout.expert_parallel_size": 1}, 2 * 128, 512),
        # PP2 x EP2: a non-owning stage also holds the PP broadcast's buffer of that w1: 3 x 128
        (
            {
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 2,
                "actor_rollout_ref.rollout.expert_parallel_size": 1,
            },
            3 * 128,
            None,
        ),
    ],
)
def test_on_0_9_1_the_bridges_all_gather_holds_one_local_expert_per_ep_rank(kw, allgather, alltoallv):
    """Megatron-Bridge's export converts one local expert per task and all-gathers it over EP (gate, then up),
    so the all-gather's buffer is EP copies of one expert's w1 (plus the PP broadcast's), not every expert of the
    layer as verl 0.7.1's per_tensor_generator gathered; ds-0206's AlltoAllV issues one call per local id."""
    key = "reshard buffer, routed experts"
    gathered = mp.plan(
        _engine(**kw, **{"actor_rollout_ref.rollout.expert_reshard": "allgather"}), TINY_DS, DIE
    )
    assert _terms(_phase(gathered, "weight sync and reshard"))[key] == allgather
    if alltoallv is not None:
        moved = mp.plan(_engine(**kw), TINY_DS, DIE)
        assert _terms(_phase(moved, "weight sync and reshard"))[key] == alltoallv
        assert "(alltoallv)" in dict(moved.facts)["reshard increment"]
    # the legacy workers' figure is every expert of the layer
    legacy = mp.plan(
        _megatron(**kw, **{"actor_rollout_ref.rollout.expert_reshard": "allgather"}), TINY_DS, DIE
    )
    assert _terms(_phase(legacy, "weight sync and reshard"))[key] == 4 * 128


def test_on_0_9_1_the_bridges_dense_export_gathers_over_tp_and_broadcasts_over_pp():
    """The largest dense weight of TINY_DS is layer 0's gate/up, 32 x 8 bf16 = 512 B, split on dim 0. TP1 PP1: the
    bridge yields the parameter itself (no buffer; 0.7.1's plan counted a gather of it); TP2: the TP all-gather's
    two shards and their concatenation, 1024; PP2: the broadcast buffer of the whole (TP1) tensor, 512."""
    key = "reshard buffer, dense"
    m = "actor_rollout_ref.actor.megatron."
    assert key not in _terms(_phase(mp.plan(_engine(), TINY_DS, DIE), "weight sync and reshard"))
    tp2 = mp.plan(_engine(**{m + "tensor_model_parallel_size": 2}), TINY_DS, DIE)
    assert _terms(_phase(tp2, "weight sync and reshard"))[key] == 1024
    pp2 = mp.plan(_engine(**{m + "pipeline_model_parallel_size": 2}), TINY_DS, DIE)
    assert _terms(_phase(pp2, "weight sync and reshard"))[key] == 512
    assert key in _terms(_phase(mp.plan(_megatron(), TINY_DS, DIE), "weight sync and reshard"))


def test_on_0_9_1_the_engine_frees_the_grad_buffer_with_the_weights_and_reloads_them_for_the_sync():
    """verl 0.9.1's MegatronEngine: param_offload moves the weights and frees the grad buffer (no grad_offload);
    the update's end offloads the weights even with the explicit offload, and update_weights loads them back for
    the export. Without param_offload the grad buffer stays on the die in every phase."""
    m = "actor_rollout_ref.actor.megatron."
    off = {m + "param_offload": True, m + "optimizer_offload": True}
    weights, grads = (
        (1792 + 256) * 2,
        (1792 + 256) * 4,
    )  # test_moe_model_by_hand_with_the_distributed_optimizer
    plan = mp.plan(_engine(**off), TINY_DS, DIE)
    offload = _phase(plan, "offload actor")
    assert "actor weights" not in _terms(offload) and "actor gradients" not in _terms(offload)
    optim = _terms(_phase(plan, "actor update"))["optimizer states"]
    assert offload.moved == weights + optim  # the grads are freed, not copied
    assert _phase(plan, "onload actor").moved == weights + optim  # and re-made zeroed on the die
    sync = _phase(plan, "weight sync and reshard")
    rollout = _terms(sync)["rollout weights"]
    assert _terms(sync)["actor weights"] == weights and sync.moved == rollout + weights
    assert _phase(plan, "onload KV cache").moved == weights
    # verl 0.7.1's workers keep the weights through the explicit offload's reshard
    legacy = mp.plan(_megatron(**off), TINY_DS, DIE)
    assert _phase(legacy, "weight sync and reshard").moved == rollout
    # without param_offload: weights and the grad buffer held from generation to the sync
    kept = mp.plan(_engine(), TINY_DS, DIE)
    for name in (
        "generation",
        "reference forward",
        "offload actor",
        "weight sync and reshard",
        "onload KV cache",
    ):
        assert _terms(_phase(kept, name))["actor gradients"] == grads, name
    assert "actor gradients" not in _terms(_phase(mp.plan(_megatron(), TINY_DS, DIE), "generation"))


def test_on_0_9_1_an_fp32_engine_holds_fp32_buffers_and_no_main_weight_copy():
    """The engine at actor.megatron.dtype=float32 (the CPU runs, cpu-0016): fp32 param and grad buffers, and the
    distributed optimizer's main weights are views of the param buffer, so a rank's optimizer states are Adam's m
    and v alone, 8 B per owned value (the by-hand layout of test_moe_model_by_hand_with_the_distributed_optimizer);
    bf16 (the default) keeps 12 B, and verl 0.7.1's workers read no dtype."""
    fp32 = mp.plan(_engine(**{"actor_rollout_ref.actor.megatron.dtype": "float32"}), TINY_DS, DIE)
    owned = {0: 272 + 96, 1: 252 + 96, 2: 332 + 96, 3: 312 + 96}
    assert fp32.rank_terms == {
        rank: {"weights": (1792 + 256) * 4, "gradients": (1792 + 256) * 4, "optimizer_states": 8 * n}
        for rank, n in owned.items()
    }
    bf16 = mp.plan(_engine(), TINY_DS, DIE)
    assert {r: t["optimizer_states"] for r, t in bf16.rank_terms.items()} == {
        r: 12 * n for r, n in owned.items()
    }
    legacy = mp.plan(_megatron(**{"actor_rollout_ref.actor.megatron.dtype": "float32"}), TINY_DS, DIE)
    assert legacy.rank_terms == bf16.rank_terms


def test_on_0_9_1_the_reference_offloads_as_the_actor_unless_told():
    """verl 0.9.1's yaml sets ref.megatron.param_offload to the actor's; 0.7.1's to False. An explicit value wins."""
    m, ref = "actor_rollout_ref.actor.megatron.", "actor_rollout_ref.ref.megatron.param_offload"
    off = {m + "param_offload": True}

    def ref_in_generation(settings):
        return "reference weights" in _terms(_phase(mp.plan(settings, TINY_DS, DIE), "generation"))

    assert not ref_in_generation(_engine(**off)) and ref_in_generation(_megatron(**off))
    assert ref_in_generation(_engine()) and ref_in_generation(_engine(**off, **{ref: False}))
    s = mp.settings_from_plan(
        {
            "config_name": "ppo_megatron_trainer",
            "verl": {"version": "0.9.1"},
            "overrides": {m + "param_offload": "True"},
        }
    )
    assert not ref_in_generation(
        dict(s, **{"trainer.n_gpus_per_node": 4, m + "expert_model_parallel_size": 2})
    )


def test_megatron_recomputes_only_what_override_transformer_config_asks_on_every_base():
    """verl 0.9.1's yaml sets model.enable_gradient_checkpointing True, which the Megatron engine does not read, and
    0.6.0 / 0.7.1's megatron workers do not read it either (their only recompute is override_transformer_config's,
    recompute_granularity null by default): the update's activations are every layer's unless it is "full"."""
    ckpt = {"actor_rollout_ref.model.enable_gradient_checkpointing": True}
    otc = "actor_rollout_ref.actor.megatron.override_transformer_config."
    full = {
        otc + "recompute_granularity": "full",
        otc + "recompute_method": "uniform",
        otc + "recompute_num_layers": 1,
    }

    def act(settings):
        return _terms(_phase(mp.plan(settings, TINY_DS, DIE), "actor update"))["activations (update)"]

    assert act(_engine(**ckpt)) == act(_engine()) == act(_megatron(**ckpt)) > act(_engine(**full))
    assert act(_engine(**full)) == act(_megatron(**full))


def test_plan_memory_compares_0_9_1s_rollout_release_and_reshard_both_ways():
    """--compare on verl 0.9.1's Megatron engine: the bridge's all-gather, the explicit offload and sleep level 1
    (kept on several nodes, as the original found; and freeing the die), each only where it changes the launch."""
    launch = _engine(**{"trainer.nnodes": 2, "trainer.n_gpus_per_node": 2})
    labels = [label for label, _ in cli.compare_changes(launch)]
    assert labels == [
        "all-gather reshard",
        "sleep level 1 (kept on several nodes)",
        "sleep level 1 (frees the die)",
        "all-gather reshard, sleep level 1 (kept)",
    ]
    kept = mp.plan(dict(launch, **{"actor_rollout_ref.rollout.explicit_offload": False}), TINY_DS, DIE)
    freed = mp.plan(
        dict(launch, **{"actor_rollout_ref.rollout.explicit_offload": False, "_sleep_frees": True}),
        TINY_DS,
        DIE,
    )
    explicit = mp.plan(launch, TINY_DS, DIE)
    assert "KV cache" in _terms(_phase(kept, "actor update"))
    assert _terms(_phase(freed, "actor update")) == _terms(_phase(explicit, "actor update"))
    assert "KV cache" not in _terms(_phase(explicit, "actor update"))
    assert [label for label, _ in cli.compare_changes(_megatron())] == [
        "all-gather reshard",
        "no explicit offload",
    ]


def test_the_qwen_default_fits_an_a2_card_on_0_7_1_and_not_on_0_9_1():
    """The single-card launcher's settings (run_qwen2_5_1_5b.sh with NPUS=1, verl 0.7.1's server mode), and the
    same on verl 0.9.1."""
    plan_json = {
        "recipe": "qwen2_5",
        "config_name": "ppo_trainer",
        "verl": {"version": "0.7.1"},
        "overrides": {
            "data.max_prompt_length": "512",
            "data.max_response_length": "1024",
            "actor_rollout_ref.model.path": "/nowhere/Qwen2_5_1_5B_Instruct",
            "actor_rollout_ref.model.enable_gradient_checkpointing": "True",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "256",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
            "actor_rollout_ref.ref.fsdp_config.param_offload": "True",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
            "actor_rollout_ref.rollout.gpu_memory_utilization": "0.8",
            "actor_rollout_ref.rollout.n": "8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
            "actor_rollout_ref.rollout.mode": "async",
            "trainer.device": "npu",
            "trainer.nnodes": "1",
            "trainer.n_gpus_per_node": "1",
        },
    }
    plan = mp.plan_launch(mp.settings_from_plan(plan_json))
    assert plan.die is mp.DIES["A2"] and plan.refusal() is None
    # the peak is generation: vLLM's 0.8 x 64 GiB plus Adam's fp32 states (1.54B x 8 B), allocated after the engine
    params = mp.total_params(mp.shapes(mp.KNOWN_MODELS["qwen2.5-1.5b"][0]))
    assert plan.peak.name == "generation"
    assert plan.peak.total == round(0.8 * 64 * mp.GIB) + 8 * params
    # the same launch on 0.9.1: vLLM-Ascend 0.23 sizes the KV cache from its whole share, beside the actor's fp32
    # weights already on the die, and Adam's states come after: it does not fit
    plan_json["verl"]["version"] = "0.9.1"
    plan = mp.plan_launch(mp.settings_from_plan(plan_json))
    assert plan.peak.name == "generation"
    assert plan.peak.total == round(0.8 * 64 * mp.GIB) + 4 * params + 8 * params
    assert plan.refusal() is not None and "KV cache" in plan.refusal()


def test_the_cli_reads_a_plan_from_stdin_and_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import io

    settings = {"trainer.device": "npu", "trainer.nnodes": "1", "trainer.n_gpus_per_node": "1"}
    plan_json = {"recipe": "qwen2_5", "config_name": "ppo_trainer", "overrides": settings}
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_QWEN))
    plan_json["overrides"]["actor_rollout_ref.model.path"] = str(model)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(plan_json)))
    assert cli.main(["--plan", "-", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["peak"]["phase"] in [p["name"] for p in doc["phases"]]
    assert doc["die"]["source"]
    big = dict(TINY_QWEN, hidden_size=8192, intermediate_size=32768, num_hidden_layers=64, vocab_size=151936)
    (model / "config.json").write_text(json.dumps(big))
    (tmp_path / "plan.json").write_text(json.dumps(plan_json))
    assert cli.main(["--plan", str(tmp_path / "plan.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plan_memory: the planned peak per die")
    assert cli.main(["--plan", str(tmp_path / "nowhere.json")]) == 2


def test_the_dry_run_prints_the_peak_per_phase():
    plan = mp.plan(_fsdp(), TINY_QWEN, DIE)
    lines = mp.short_plan_lines(plan)
    assert len(lines) == len(plan.phases)
    marked = [ln for ln in lines if ln.endswith("<- peak")]
    assert len(marked) == 1 and marked[0].startswith(plan.peak.name)
    table = mp.table(plan)
    assert all(p.name in table for p in plan.phases)


def test_the_launchers_dry_run_prints_the_plans_peak_per_phase(tmp_path, verl_tree):
    """Through the single-card launcher as a user runs it (verl 0.6.0 tree of the fixtures; no model there, so
    the shipped Qwen2.5-1.5B table is used): a memory line in the report and the plan's phases after it."""
    from launcher_env import launcher_env, run_launcher

    proc = run_launcher(QWEN_SINGLE, ["--dry-run"], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    memory = next(ln for ln in lines if ln.lstrip().startswith("memory "))
    assert " ok " in memory and "generation" in memory and "Atlas A2" in memory
    start = next(i for i, ln in enumerate(lines) if ln.startswith("memory plan per die"))
    phases = [ln.split()[0] for ln in lines[start + 1 : start + 10]]
    assert phases[0] == "generation" and "actor" in phases
    assert sum(ln.endswith("<- peak") for ln in lines) == 1


def test_the_deepseek_dry_run_on_0_9_1_prints_the_megatron_engines_plan(tmp_path, pristine_base):
    """run_deepseek_r1_a3.sh --base 0.9.1 --dry-run: the preflight's plan (from 0.9.1's composed config) is the
    engine's, the same as plan_memory's from the launch's JSON: the bridge's weight sync, the original's recompute
    (full, block, 8: override_transformer_config's; the yaml's enable_gradient_checkpointing=True is not the Megatron
    engine's) on its split [7,7,8,8,8,8,8,7], and, with ds-0204's explicit offload (the base's overrides), a step that
    fits the A3 die, its peak in the weight sync of an 8-layer stage; sleep level 1 kept on the die would not."""
    import shutil

    from launcher_env import launcher_env, run_launcher

    tree = tmp_path / "verl-0.9.1"
    shutil.copytree(pristine_base("0.9.1"), tree, symlinks=True)
    env = launcher_env(tmp_path, tree)
    env.pop("VERL_BASE")
    proc = run_launcher(DEEPSEEK, ["--base", "0.9.1", "--dry-run"], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("memory plan per die"))
    printed = {}
    for ln in lines[start + 1 : start + 10]:
        name, gib = ln.split("GiB")[0].rsplit(None, 1)
        printed[name.strip().removeprefix("-> ")] = gib
    proc = run_launcher(DEEPSEEK, ["--base", "0.9.1", "--dry-run", "--json"], env)
    settings = mp.settings_from_plan(json.loads(proc.stdout))
    plan = mp.plan_launch(settings)
    assert mp.megatron_engine(settings)
    assert printed == {ph.name: f"{ph.total / mp.GIB:.2f}" for ph in plan.phases}
    assert plan.peak.name == "weight sync and reshard" and printed["weight sync and reshard"] == "54.52"
    assert printed["actor update"] == "48.08" and plan.stage == 2
    assert plan.refusal() is None, plan.refusal()
    kept = mp.plan_launch(
        dict(
            settings,
            **{
                "actor_rollout_ref.rollout.explicit_offload": False,
                "actor_rollout_ref.rollout.enable_sleep_mode": True,
            },
        )
    )
    assert f"{kept.peak.total / mp.GIB:.2f}" == "99.05" and kept.refusal() is not None
    sync = _terms(_phase(plan, "weight sync and reshard"))
    w1 = 2 * 2048 * 7168 * 2  # one expert's fused gate/up, bf16: 56 MiB
    assert (
        sync["reshard buffer, routed experts"] == 3 * w1
    )  # ds-0206's worst call at EP128 (the README's figure)
    gathered = mp.plan_launch(dict(settings, **{"actor_rollout_ref.rollout.expert_reshard": "allgather"}))
    assert _terms(_phase(gathered, "weight sync and reshard"))["reshard buffer, routed experts"] == 9 * w1


@pytest.fixture
def memory_hook(tmp_path, monkeypatch):
    """hooks/recipes_memory_record.py imported with its record file set: (the module, the record file)."""
    import importlib
    import sys

    from ascend_rl.paths import HOOK_PATH

    record = tmp_path / "memory.jsonl"
    monkeypatch.setenv("RECIPES_MEMORY_RECORD", str(record))
    for folder in reversed(HOOK_PATH):
        monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("recipes_memory_record", None)
    try:
        yield importlib.import_module("recipes_memory_record"), record
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "recipes_memory_record"]
        sys.modules.pop("recipes_memory_record", None)


def _stepped_record(hook, record, stand_in: str, patch: str, attrs: dict[str, str], method: str) -> dict:
    """A stand-in class `stand_in` holding a Linear(8, 4) and its AdamW under `attrs` (role -> attribute), patched
    by the hook's `patch` and stepped once through `method` after a backward pass: the one record it wrote."""
    import types

    import torch

    model = torch.nn.Linear(8, 4)  # 32 + 4 fp32 values

    def __init__(self):
        setattr(self, attrs["model"], model)
        setattr(self, attrs["optimizer"], torch.optim.AdamW(model.parameters()))

    def step(self):
        getattr(self, attrs["optimizer"]).step()

    cls = type(stand_in, (), {"__init__": __init__, method: step})
    getattr(hook, patch)(types.SimpleNamespace(**{stand_in: cls}))
    model(torch.ones(2, 8)).sum().backward()
    getattr(cls(), method)()
    (line,) = [json.loads(x) for x in record.read_text().splitlines()]
    return line


@pytest.mark.parametrize(
    "stand_in,patch,attrs,method",
    [
        # verl 0.6.0 / 0.7.1: the dp_actor's step
        (
            "DataParallelPPOActor",
            "_patch_actor",
            {"model": "actor_module", "optimizer": "actor_optimizer"},
            "_optimizer_step",
        ),
        # verl 0.9.1's engine workers: the FSDP engine's step (workers/engine/fsdp/transformer_impl.py)
        ("FSDPEngine", "_patch_engine", {"model": "module", "optimizer": "optimizer"}, "optimizer_step"),
    ],
)
def test_the_memory_hook_records_weights_gradients_and_adam_states(
    memory_hook, stand_in, patch, attrs, method
):
    """hooks/recipes_memory_record.py on a stand-in for verl's actor (0.6.0 / 0.7.1) or FSDP engine (0.9.1): the
    bytes it writes are the tensors' sizes (the full-tier test below runs it inside a real CPU run)."""
    hook, record = memory_hook
    line = _stepped_record(hook, record, stand_in, patch, attrs, method)
    assert line["phase"] == "actor update" and line["strategy"] == "fsdp"
    assert (line["weights"], line["gradients"], line["optimizer_states"]) == (36 * 4, 36 * 4, 2 * 36 * 4)


def test_the_memory_hook_records_the_megatron_engines_step(memory_hook):
    """verl 0.9.1's MegatronEngine.optimizer_step on a stand-in: its model chunks (`module`) and a Megatron-style
    optimizer whose torch optimizer steps fp32 main weights that are the weights themselves (fp32 weights: the
    distributed optimizer's main weights are views of the param buffer), so they add nothing to the optimizer's
    bytes; a bf16-style copy of them would."""
    import types

    import torch

    hook, record = memory_hook
    model = torch.nn.Linear(8, 4)  # 32 + 4 fp32 values
    copies = [p.detach().clone() for p in model.parameters()]

    def make(mains):
        def __init__(self):
            self.module = [model]
            self.optimizer = types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(optimizer=None)])
            inner = torch.optim.AdamW(mains)
            self.optimizer.chained_optimizers[0].optimizer = inner

        def optimizer_step(self):
            for main, param in zip(mains, model.parameters(), strict=True):
                main.grad = param.grad
            self.optimizer.chained_optimizers[0].optimizer.step()
            return 1.0

        return type("MegatronEngine", (), {"__init__": __init__, "optimizer_step": optimizer_step})

    model(torch.ones(2, 8)).sum().backward()
    views, cloned = make(list(model.parameters())), make(copies)
    hook._patch_megatron_engine(types.SimpleNamespace(MegatronEngine=views))
    hook._patch_megatron_engine(types.SimpleNamespace(MegatronEngine=cloned))
    assert views().optimizer_step() == 1.0 and cloned().optimizer_step() == 1.0
    first, second = [json.loads(x) for x in record.read_text().splitlines()]
    assert first["phase"] == "actor update" and first["strategy"] == "megatron"
    assert (first["weights"], first["gradients"], first["optimizer_states"]) == (36 * 4, 36 * 4, 2 * 36 * 4)
    assert first["main_params"] == 0
    assert (second["optimizer_states"], second["main_params"]) == (3 * 36 * 4, 36 * 4)


# --- checked against measurement (make test-full): a CPU run's bytes per rank and phase equal the plan's

# One launch per run, each one step: the launcher, its verl base, the launcher's own settings (NPUS: ranks).
QWEN_RANKS = RECIPES / "qwen2_5" / "run_qwen2_5_1_5b.sh"
DEEPSEEK = RECIPES / "deepseek_r1" / "run_deepseek_r1_a3.sh"
MEASURED_RUNS = {
    # FSDP2 on one rank, vLLM in-process (0.6.0's sync rollout) and in its server (0.7.1)
    "qwen-v060": (QWEN_SINGLE, "0.6.0", {}),
    "qwen-v071": (QWEN_SINGLE, "0.7.1", {}),
    # FSDP2 over 2 ranks: each parameter's dim 0 split, one vLLM server per rank
    "qwen-2r-v071": (QWEN_RANKS, "0.7.1", {"NPUS": "2", "RAY_DEDUP_LOGS": "0"}),
    # verl 0.9.1's engine workers (the FSDP2 engine), vLLM 0.23.0's CPU build: one rank and 2
    "qwen-v091": (QWEN_SINGLE, "0.9.1", {}),
    "qwen-2r-v091": (QWEN_RANKS, "0.9.1", {"NPUS": "2", "RAY_DEDUP_LOGS": "0"}),
    # verl's Megatron actor on 2 ranks, EP=2: dense weights data-parallel, the experts split; the distributed
    # optimizer's dense part over DP 2, its expert part over expert-DP 1
    "deepseek-v060": (DEEPSEEK, "0.6.0", {}),
    "deepseek-v071": (DEEPSEEK, "0.7.1", {}),
    # verl 0.9.1's Megatron engine (fp32 on CPU), the same layout: its optimizer step (MegatronEngine.optimizer_step)
    "deepseek-v091": (DEEPSEEK, "0.9.1", {}),
}
MEASURED_RANKS = {
    "qwen-2r-v071": 2,
    "qwen-2r-v091": 2,
    "deepseek-v060": 2,
    "deepseek-v071": 2,
    "deepseek-v091": 2,
}

DRIVER = """
import json, subprocess, sys
from pathlib import Path
from ascend_rl.harness import e2e, launch as hl
from ascend_rl.paths import REPO

out, name, launcher, base = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
extra, record = json.loads(sys.argv[5]), Path(sys.argv[1]) / "memory.jsonl"
overrides = ["trainer.total_training_steps=1"]
if name.startswith("deepseek"):
    model_dir, data_dir = e2e.prepare_deepseek_inputs(out, base=base)
else:
    model_dir, data_dir = e2e.prepare_inputs(out, warm_start_steps=300)
# the launch plan of exactly this launch (the harness's environment), then the launch with the hook on
env = hl.launcher_env(name, out, model_dir, data_dir, False, base=base)
env.update(extra)
plan = subprocess.run(["bash", str(launcher), "--cpu", "--json", *overrides], env=env, cwd=REPO,
                      capture_output=True, text=True, timeout=900)
assert plan.returncode == 0, plan.stderr[-3000:]
(out / "plan.json").write_text(plan.stdout)
hl.launch(name, launcher, overrides, out, model_dir, data_dir, timeout_s=1500, base=base, extra_env=extra,
          hook_env={"RECIPES_MEMORY_RECORD": str(record)})
print(json.dumps({"model": str(model_dir)}))
"""


@pytest.mark.full
@pytest.mark.parametrize("run", list(MEASURED_RUNS))
def test_a_cpu_runs_bytes_per_rank_and_phase_equal_the_plan(e2e_python, tmp_path, run, request):
    """A launcher's CPU profile, one step with hooks/recipes_memory_record.py on: every rank's optimizer step (its
    actor weights, gradients and optimizer states) and every vLLM engine (its weights, its KV cache per token) equal
    the plan made from the same launch's dry-run JSON, that rank's figures where the plan has them per rank."""
    import subprocess

    from ascend_rl.harness.launch import BASE_ENVS
    from ascend_rl.paths import REPO, child_env

    launcher, base, extra = MEASURED_RUNS[run]
    if base in BASE_ENVS:
        # the driver runs in the e2e environment, as the harness does (it makes the inputs); the launcher in the
        # base's own (.venv-e2e-091 for 0.9.1: its fixture builds it), which the harness hands it (launch.BASE_ENVS)
        request.getfixturevalue("e2e_python_091")
    proc = subprocess.run(
        [str(e2e_python), "-c", DRIVER, str(tmp_path), run, str(launcher), base, json.dumps(extra)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    model = json.loads(proc.stdout.strip().splitlines()[-1])["model"]
    settings = mp.settings_from_plan(json.loads((tmp_path / "plan.json").read_text()))
    cfg, _ = mp.model_config(model)
    plan = mp.plan(settings, cfg, mp.die_for(settings))
    records = [json.loads(line) for line in (tmp_path / "memory.jsonl").read_text().splitlines()]
    assert not [r for r in records if "error" in r], records
    updates = [r for r in records if r["phase"] == "actor update"]
    engines = [r for r in records if r["phase"] == "generation"]
    ranks = MEASURED_RANKS.get(run, 1)
    # one optimizer step per rank (one step, one mini-batch); an engine per rank (rollout TP 1)
    assert sorted(r["rank"] for r in updates) == list(range(ranks)), records
    assert len(engines) >= ranks, records
    for r in updates:
        planned = mp.measured_terms(plan, rank=r["rank"])
        measured = {k: r[k] for k in ("weights", "gradients", "optimizer_states")}
        assert measured == {k: planned[k] for k in measured}, (run, r, planned)
    # three ways: the shape check's build of the same launch (verl 0.9.1's Megatron ranks on the fake backend, at
    # this run's layout and fp32) = the plan = what each rank measured in its optimizer step
    from ascend_rl.harness import shape_check as sc

    if settings["actor_rollout_ref.actor.strategy"] == "megatron" and base in sc.BUILT_BASES:
        t = sc.Target(settings, dict(cfg), base, "deepseek_r1")
        result = sc.build(t, sc.rank_classes(t), jobs=2, use_cache=False, log=lambda *a: None)
        built = {key: fig for row in result["ranks"] for key, fig in sc.built_figures(t, row).items()}
        assert sc.compare(built, sc.planned_figures(t)) == [], (run, result)
        for r in updates:
            b = built[(r["rank"], "actor")]
            assert (b.weights, b.gradients, b.optimizer) == (
                r["weights"],
                r["gradients"],
                r["optimizer_states"],
            )
    planned = mp.measured_terms(plan)
    for r in engines:
        assert r["rollout_weights"] == planned["rollout_weights"], (run, r, planned)
        assert r["kv_cache"] == r["num_blocks"] * r["block_size"] * planned["kv_cache_per_token"], (
            run,
            r,
            planned,
        )


def test_the_deepseek_default_fits_an_a3_die_with_bf16_gradients_and_not_with_verls_fp32(tmp_path, verl_tree):
    """The DeepSeek launcher's own dry-run plan (TP4 PP8 EP8 on 256 dies): its gradients reduced in bf16, as the
    original's trainer did, keep the actor update under the A3 die's limit; verl's fp32 default would not."""
    from launcher_env import launcher_env, run_launcher

    proc = run_launcher(DEEPSEEK, ["--dry-run", "--json"], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    settings = mp.settings_from_plan(json.loads(proc.stdout))
    key = "actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32"
    assert settings[key] is False
    bf16 = mp.plan_launch(settings)
    fp32 = mp.plan_launch(dict(settings, **{key: True}))
    assert bf16.refusal() is None, bf16.refusal()

    def terms(plan, phase):
        return {t.name: t.nbytes for t in next(p for p in plan.phases if p.name == phase).terms}

    bf16_grads, fp32_grads = (terms(p, "actor update")["actor gradients"] for p in (bf16, fp32))
    assert fp32_grads == 2 * bf16_grads  # 4 B against 2 B a parameter
    assert fp32.refusal() is not None and "actor gradients" in fp32.refusal()
    # the step's fp32 copy of the rank's grad part (swap_optimizer: 1/16 at a time) is a phase of its own
    assert "fp32 main grads" in terms(bf16, "optimizer step")
    assert "optimizer step" not in {p.name for p in fp32.phases}
