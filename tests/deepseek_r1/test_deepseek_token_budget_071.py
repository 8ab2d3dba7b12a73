"""ds-0007 (the token budget) is retired on verl 0.7.1: the real variant's budget passes 0.7.1's own checks.

verl 0.7.0 aligned its rollout's check with vLLM's (PR 4153, commit c04e8a27a, in vllm_rollout_spmd.py);
0.7.1 has no sync rollout at all, and its server hands max_num_batched_tokens to vLLM, whose own rule
(SchedulerConfig, tested against the wheel in test_vllm_ascend_contract.py) accepts a budget below
max_model_len under chunked prefill. Here the pristine 0.7.1 tree composes the launcher's real-variant
settings and its own validate_config passes them, while a setting it does refuse still fails (the check ran).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ascend_rl import preflight

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "llm_rl/deepseek_r1/run_deepseek_r1_a3.sh"


def _launcher_value(key: str, block: str | None = None) -> str:
    """The value the launcher gives `key` (inside its `block) OVERRIDES+=(` ... `) ;;` when a block is named)."""
    text = LAUNCHER.read_text()
    if block:
        text = re.search(rf"\n\s*{block}\) OVERRIDES\+=\((.*?)\n\s*\) ;;", text, re.S).group(1)
    found = re.findall(rf"^\s*{re.escape(key)}=(\S+)\s*$", text, re.M)
    assert len(found) == 1, (key, found)
    return found[0]


@pytest.fixture(scope="module")
def tree(pristine_base) -> Path:
    return pristine_base("0.7.1")


def _real_overrides() -> list[str]:
    rollout = "actor_rollout_ref.rollout."
    keys = [(rollout + "max_num_batched_tokens", "real"), (rollout + "enable_chunked_prefill", "real")]
    keys += [
        ("data.max_prompt_length", None),
        ("data.max_response_length", None),
        ("algorithm.adv_estimator", None),
    ]
    return [f"{k}={_launcher_value(k, block)}" for k, block in keys] + [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
    ]


def test_071_has_no_verl_side_budget_check(tree):
    assert not (tree / "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py").exists()
    uses = sorted(
        str(p.relative_to(tree))
        for p in (tree / "verl").rglob("*.py")
        if "max_num_batched_tokens" in p.read_text(encoding="utf-8", errors="replace")
    )
    # the config field and the server's engine arguments; nothing compares it with max_model_len
    assert uses == [
        "verl/workers/config/rollout.py",
        "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
    ]


def test_real_variant_budget_passes_071_validate_config(tree):
    overrides = _real_overrides()
    assert "actor_rollout_ref.rollout.max_num_batched_tokens=1024" in overrides
    assert "actor_rollout_ref.rollout.enable_chunked_prefill=True" in overrides
    cfg = preflight.compose(tree, "ppo_megatron_trainer", overrides)
    assert cfg.actor_rollout_ref.rollout.max_num_batched_tokens == 1024
    assert cfg.actor_rollout_ref.rollout.prompt_length + cfg.actor_rollout_ref.rollout.response_length == 4096
    verdict = preflight.check_verl_config(cfg, tree)
    print("0.7.1 validate_config, real variant (1024 tokens, max_model_len 4096, chunked):", verdict)
    assert verdict.status == "ok", verdict.detail
    assert preflight.check_rollout_budget(cfg, tree).status == "ok"

    # the negative control: the same validate_config refuses what 0.7.1 does refuse
    bad = preflight.compose(tree, "ppo_megatron_trainer", overrides + ["data.train_batch_size=4"])
    refused = preflight.check_verl_config(bad, tree)
    assert refused.status == "FAIL" and "verl refuses the config" in refused.detail, refused.detail
