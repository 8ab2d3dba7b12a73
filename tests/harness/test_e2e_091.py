"""verl 0.9.1's real launch path on CPU (`make e2e E2E_ARGS="--runs v091,v091-resume,qwen-2r-v091"`): the Qwen
launcher's CPU profile on the 0.9.1 base (the Qwen default), main_ppo's legacy trainer, the engine workers (FSDP2 on
gloo), verl's vLLM server rollout on vLLM 0.23.0's CPU build, in the second e2e environment (.venv-e2e-091; the
e2e_python_091 fixture builds it).

Full tier: the resume from its own checkpoint and the two-rank launch, in one e2e command with the v091 run they
continue. make test runs v091 alone with its negative control (test_e2e.py, the default runs). The harness itself runs
in the first e2e environment (it makes the inputs) and hands the 0.9.1 environment's Python to the launcher
(ascend_rl/harness/launch.py, BASE_ENVS).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e import _e2e, _tail, check_v091  # the same e2e command, failure tail and v091 checks

import tier_report

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.full]
RUNS = ("v091", "v091-resume", "qwen-2r-v091")


@pytest.fixture(scope="module")
def runs_091(e2e_python, e2e_python_091, tmp_path_factory):
    """v091 (3 steps, checkpoint at step 2), v091-resume (step 3 from that checkpoint) and qwen-2r-v091 (the
    four-card launcher with NPUS=2), in one e2e command."""
    assert (REPO / ".venv-e2e-091" / "bin" / "python").resolve() == e2e_python_091.resolve()
    out = tmp_path_factory.mktemp("e2e091") / "e2e_out"
    proc, summary = _e2e(e2e_python, out, "--runs", ",".join(RUNS))
    tier_report.record_e2e("test_e2e_091", summary, list(RUNS))
    return proc, summary, out


def test_the_0_9_1_base_trains_and_vllm_samples_from_the_synced_weights(runs_091):
    check_v091(*runs_091)


def test_the_0_9_1_base_resumes_from_its_own_checkpoint(runs_091):
    proc, summary, out = runs_091
    assert summary, _tail(proc)
    run = summary["runs"]["v091-resume"]
    assert run["base"] == "0.9.1"
    assert run["resumed_from_step"] == 2 and run["steps_done"] == [3]
    assert run["forward_passes"] == [1] and run["old_log_prob_pass"] == [False], run


def test_the_0_9_1_base_trains_on_two_ranks(runs_091):
    """qwen-2r-v091: FSDP2 over 2 gloo ranks, one vLLM server per rank, each rank's shard in the checkpoint."""
    proc, summary, _ = runs_091
    assert summary, _tail(proc)
    run = summary["runs"]["qwen-2r-v091"]
    assert run["base"] == "0.9.1" and run["steps_done"] == [1, 2, 3]
    assert run["dp_ranks"] == [2, 2, 2] and run["rollout_servers"] == 2
    assert run["forward_passes"] == [1, 1, 1], run
    assert run["checkpoint"]["world_size"] == 2 and run["checkpoint"]["shard_ranks"] == [0, 1]
    checks = [c for c in summary["checks"] if c["run"] == "qwen-2r-v091"]
    assert checks and all(c["ok"] for c in checks), checks
