"""The DeepSeek recipe's Megatron actor on CPU: verl's MegatronPPOActor, two gloo processes, EP=2, against HF.

llm_rl/deepseek_r1/check_megatron.py runs under the e2e environment (the e2e_python fixture builds it when absent),
with megatron-core and mbridge at the constraints.txt pins in their own folder of the download cache
(artifacts.megatron_packages; skipped with the reason when the package index cannot be reached, a failure under
CI=true: tests/ci_policy.py), on verl 0.6.0 with the DeepSeek series and the CPU overlay (cpu-0005 makes
megatron-core 0.12.1 run on CPU). It builds the actor as ActorRolloutRefWorker.init_model does, compares
MegatronPPOActor.compute_log_prob with Hugging Face's DeepseekV3ForCausalLM holding the weights verl's
per_tensor_generator exports, runs one update_policy without old_log_probs (actor.recompute_old_log_prob=False,
patch shared-0101's Megatron branch) and the rollout.expert_reshard=alltoallv export (patch ds-0006). The update is
ActorRolloutRefWorker.update_actor's own, after the launcher's parameter / gradient / optimizer offload with
explicit offload (ds-0004). Negative controls: HF with two routed experts swapped (in every run), and a run with
one of cpu-0005's megatron-core fixes taken back off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import check_script
from ascend_rl import artifacts
from ci_policy import get_artifact

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "llm_rl.deepseek_r1.check_megatron"
# make test-full: verl 0.6.0's component checks (its stack, vLLM 0.13 and megatron-core 0.12.1), which the full tier's
# `deepseek` run (0.6.0) proves end to end; make test runs the default base's (deepseek-v091 in test_e2e.py)
pytestmark = [pytest.mark.slow, pytest.mark.full]
TOL = 1e-4  # the script's LOGPROB_TOL; seen: 5e-7 and 1e-6 (fp32, packed THD against HF unpacked)


@pytest.fixture(scope="module")
def megatron_python(e2e_python, verl_sdist_path):
    """The e2e Python, once megatron-core / mbridge are in the cache (tests/ci_policy.py: a skip with the reason
    only when the package index cannot be reached, and not under CI=true)."""
    get_artifact("megatron-core / mbridge", artifacts.megatron_packages, e2e_python)
    return e2e_python


def run_check(python: Path, work: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    return check_script.run_check(python, SCRIPT, work, *extra)


@pytest.fixture(scope="module")
def megatron_check(megatron_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("deepseek-megatron")
    proc, result = run_check(megatron_python, work)
    return proc, result, work


def test_every_check_holds(megatron_check):
    proc, result, _ = megatron_check
    assert "error" not in result, result.get("error")
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed and proc.returncode == 0, f"{failed}\n{proc.stdout[-3000:]}"
    print(
        f"\nwall {result['wall_s']} s (set-up {result['setup_s']} s), peak {result['peak_rss_gib_sum']} GiB "
        f"(both ranks), gaps {[r['gap_initial'] for r in result['ranks']]}"
    )


def test_actor_log_probs_equal_hf_with_the_exported_weights(megatron_check):
    _, result, _ = megatron_check
    ranks = result["ranks"]
    assert [r["ep_rank"] for r in ranks] == [0, 1] and all(r["dp_size"] == 2 for r in ranks)
    for r in ranks:
        # 2 layers: the dense one and the MoE one with 8 experts x 3, as HF names and shapes them
        assert r["tensors"] == 53 and r["hf_state_dict_keys_equal"], r
        assert r["gap_initial"] <= TOL, r
        # the negative control: experts 0 and 5 (one on each EP rank) swapped in HF
        assert r["gap_experts_swapped"] >= 100 * TOL, r


def test_one_update_without_old_log_probs_moves_the_policy(megatron_check):
    """The worker's update_actor, given the batch as the trainer sends it when the old-log-prob pass is skipped
    (no old_log_probs, no temperature: shared-0101's update_actor hunk; without it KeyError 'temperature'),
    after init_model's parameter and optimizer offload (cpu-0005's copy: .cpu() alone aliased the storage that
    the offload then freed)."""
    _, result, _ = megatron_check
    for r in result["ranks"]:
        assert r["resident_before_offload"] and not r["resident_after_offload"], r
        assert r["resident_after_update"], r  # explicit offload (ds-0004): left resident for the reshard
        assert r["tensors_moved"] == r["tensors"], r  # all 53, the router's expert bias too
        assert r["gap_updated"] <= TOL, r  # the new export still equals the actor
        assert r["gap_updated_vs_initial_weights"] > 100 * TOL, r  # and it is a different policy
        assert r["grad_norm"] and all(g > 0 for g in r["grad_norm"]), r
    # one data-parallel update: both ranks stepped with the same (all-reduced) gradient norm
    assert result["ranks"][0]["grad_norm"] == result["ranks"][1]["grad_norm"]


def test_alltoallv_export_delivers_each_rank_its_experts(megatron_check):
    _, result, _ = megatron_check
    for r in result["ranks"]:
        assert r["alltoallv_names_as_planned"] and r["alltoallv_bit_equal"], r
        assert r["alltoallv_expert_tensors"] == 12 and r["alltoallv_tensors"] == 53 - 12, r


def test_without_the_split_size_fix_the_ep_all_to_all_fails(megatron_python, megatron_check, tmp_path):
    """cpu-0005's fix of megatron-core's maybe_move_tensor_to_cpu taken back off: gloo refuses the split sizes."""
    _, _, work = megatron_check
    proc, result = run_check(
        megatron_python, tmp_path, "--tree", str(work / "verl-cpu"), "--undo", "split-sizes"
    )
    assert proc.returncode == 1
    assert "alltoall_base(): incompatible function arguments" in result["error"], result


def test_the_check_refuses_a_python_without_the_e2e_environment(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", SCRIPT, "--work", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and ".venv-e2e/bin/python" in proc.stderr


def test_cpu_compat_changes_nothing_off_the_cpu(megatron_python, megatron_check):
    """apply() on a device other than the CPU (verl's get_device_name answering npu) leaves torch alone."""
    _, _, work = megatron_check
    code = (
        "import torch\n"
        "from verl.utils.megatron import cpu_compat\n"
        "cpu_compat.get_device_name = lambda: 'npu'\n"
        "before = (torch.cuda.current_device, torch.cuda.Stream, torch.Tensor.cuda, torch.Tensor.type)\n"
        "cpu_compat.apply()\n"
        "after = (torch.cuda.current_device, torch.cuda.Stream, torch.Tensor.cuda, torch.Tensor.type)\n"
        "assert before == after and not cpu_compat._applied and cpu_compat.use_transformer_engine()\n"
        "cpu_compat.get_device_name = lambda: 'cpu'\n"
        "cpu_compat.apply()\n"
        "assert cpu_compat._applied and torch.cuda.current_device() == torch.device('cpu')\n"
        "assert not cpu_compat.use_transformer_engine()\n"
        "print('ok')\n"
    )
    env_path = f"{work / 'verl-cpu'}:{artifacts.megatron_packages(megatron_python)}"
    proc = subprocess.run(
        [str(megatron_python), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": env_path, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
