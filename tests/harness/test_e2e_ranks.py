"""The four-card Qwen launcher on more than one rank (`make e2e`'s qwen-2r): `run_qwen2_5_1_5b.sh --cpu` with NPUS=2
on verl 0.7.1, FSDP2 sharded over 2 gloo ranks and one vLLM server per rank, on one machine.

Needs the e2e environment (the e2e_python fixture, conftest.py). One run of about as long as the v071 run and
somewhat more memory (a second trainer process and a second vLLM engine), so make test-full only. The dry-run
sizing of the same launch (no training) is tests/launch/test_cpu_profile.py's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import tier_report
from ascend_rl.harness import e2e

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.full
RUN = "qwen-2r"


@pytest.fixture(scope="module")
def ranks_run(e2e_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e_ranks") / "e2e_out"
    proc = subprocess.run(
        [str(e2e_python), "-m", "ascend_rl", "e2e", "--runs", RUN, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    tier_report.record_e2e("test_e2e_ranks", summary, [RUN])
    return proc, summary, out


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_the_four_card_launcher_trains_on_two_ranks_with_a_rollout_each(ranks_run):
    proc, summary, out = ranks_run
    assert proc.returncode == 0, _tail(proc)
    run = summary["runs"][RUN]
    assert run["base"] == "0.7.1" and run["steps_done"] == [1, 2, 3]
    # verl split every step's batch over 2 data-parallel ranks, and each rank wrote its own FSDP shard
    assert run["dp_ranks"] == [2, 2, 2], run["dp_ranks"]
    ckpt = run["checkpoint"]
    assert ckpt["step"] == 3 and ckpt["world_size"] == 2, ckpt
    assert ckpt["shard_ranks"] == [0, 1] and ckpt["shard_world_sizes"] == [2], ckpt
    actor = out / RUN / "ckpt" / f"e2e_{RUN}" / "global_step_3" / "actor"
    assert {p.name for p in actor.glob("model_world_size_*.pt")} == {
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    }
    assert run["rollout_servers"] == 2, "one vLLM server per rank"
    log = (out / RUN / "launcher.log").read_text(errors="replace")
    assert "run_qwen2_5_1_5b.sh" in proc.stdout and "NPUS=2" in proc.stdout, (
        "not the four-card launcher at NPUS=2"
    )
    assert "verl-0.7.1-cpu" in log, "the run did not use the 0.7.1 CPU tree"
    assert all(c["ok"] for c in summary["checks"]), summary["checks"]


def test_vllm_samples_from_the_updated_weights_on_both_ranks(ranks_run):
    """At the last step the policy has moved (stale gap >= 0.01) and the rollout gap, over the samples of both
    vLLM servers, is a fifth of that or less: a server left on old weights would hold it near the stale gap."""
    proc, summary, _ = ranks_run
    assert summary, _tail(proc)
    r = summary["runs"][RUN]
    stale, rollout = r["stale_probs_diff_mean"][-1], r["rollout_probs_diff_mean"][-1]
    assert stale >= 0.01, f"the policy barely moved (stale gap {stale}); the check would prove nothing"
    assert rollout <= stale / 5, f"rollout gap {rollout} vs stale gap {stale}: vLLM holds old weights"


def test_the_rank_check_fails_a_run_on_one_rank(ranks_run):
    """The same figures from a one-rank run fail the check: it cannot pass without two ranks and two servers."""
    _, summary, _ = ranks_run
    one = {
        "dp_ranks": [1, 1, 1],
        "checkpoint": {"step": 3, "world_size": 1, "shard_ranks": [0], "shard_world_sizes": [1]},
        "rollout_servers": 1,
    }
    assert not any(c["ok"] for c in e2e.check_ranks(RUN, one, 2))
    run = summary["runs"][RUN]
    got = {key: run[key] for key in one}
    assert all(c["ok"] for c in e2e.check_ranks(RUN, got, 2)), got
