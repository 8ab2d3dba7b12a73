"""The reward manager a launch names is one its verl tree registers (issue 36, item 4).

verl 0.6.0's trainer looks reward managers up in verl.workers.reward_manager; verl 0.7.1's in its reward loop's
registry, which has no `batch` (0.7.1's load_reward_manager raises `ValueError: Unknown reward manager: batch`).
The preflight reads the registry from the tree's own source on every base and refuses, in one line naming the
registered ones, a name that tree does not have. The recipe README's reward settings per base are dry-run here
on the base they are given for.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ascend_rl import preflight
from launcher_env import launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
README = REPO / "llm_rl" / "qwen2_5" / "README.md"

# What each pinned sdist registers, read by importing the registries in the e2e environment (verl's own code):
# the registry its trainer reads, and every name in it.
REGISTERED = {
    "0.6.0": ("verl.workers.reward_manager", {"batch", "dapo", "naive", "prime"}),
    "0.7.1": (
        "verl.experimental.reward_loop.reward_manager",
        {"dapo", "gdpo", "naive", "rate_limited", "remote"},
    ),
}


def _cfg(tree: Path, *overrides: str):
    return preflight.compose(tree, "ppo_trainer", list(overrides), resolve=False)


@pytest.mark.parametrize("base", sorted(REGISTERED))
def test_the_registry_is_read_from_the_trees_own_source(pristine_base, base):
    registry = preflight.reward_registry(pristine_base(base))
    module, names = REGISTERED[base]
    assert registry is not None and registry.module == module
    assert set(registry.names) == names
    for name, where in registry.names.items():  # each with the line of its register("name") call
        file, _, line = where.rpartition(":")
        text = (pristine_base(base) / file).read_text().splitlines()[int(line) - 1]
        assert re.search(rf"register\w*\(\"{name}\"\)", text), (where, text)


def test_batch_on_071_is_refused_in_one_line_naming_what_it_has(pristine_base):
    tree = pristine_base("0.7.1")
    check = preflight.check_reward(
        _cfg(tree, "reward_model.reward_manager=batch", "custom_reward_function.name=compute_score_batch"),
        tree,
    )
    assert check.status == "FAIL" and check.name == "reward mgr" and "\n" not in check.detail
    assert check.detail.startswith(
        "reward_model.reward_manager=batch: verl 0.7.1's trainer has no reward manager 'batch'"
    )
    assert (
        "verl.experimental.reward_loop.reward_manager, which registers dapo, gdpo, naive, rate_limited, remote"
        in (check.detail)
    )
    # why a user reading 0.7.1's tree finds batch.py there all the same
    assert (
        "verl/workers/reward_manager/batch.py:25 registers 'batch' in verl.workers.reward_manager"
        in check.detail
    )
    # named through 0.7.1's own key, the same refusal
    own = preflight.check_reward(_cfg(tree, "reward.reward_manager.name=batch"), tree)
    assert own.status == "FAIL" and own.detail.startswith("reward.reward_manager.name=batch:")
    # a class verl loads by module path is not looked up in the registry
    assert (
        preflight.check_reward_manager(
            _cfg(tree, "reward.reward_manager.source=importlib", "reward.reward_manager.name=Mine"), tree
        )
        is None
    )


def test_071s_own_managers_pass(pristine_base):
    tree = pristine_base("0.7.1")
    for name in REGISTERED["0.7.1"][1]:
        assert preflight.check_reward_manager(_cfg(tree, f"reward_model.reward_manager={name}"), tree) is None
    assert preflight.check_reward(_cfg(tree), tree).status == "ok"  # the default, naive


def test_060_takes_batch_and_refuses_a_name_it_lacks(pristine_base):
    tree = pristine_base("0.6.0")
    reward = REPO / "llm_rl" / "qwen2_5" / "new_math_reward.py"
    ok = preflight.check_reward(
        _cfg(
            tree,
            f"custom_reward_function.path={reward}",
            "reward_model.reward_manager=batch",
            "custom_reward_function.name=compute_score_batch",
        ),
        tree,
    )
    assert ok.status == "ok" and ok.detail.endswith(":compute_score_batch (batch reward manager)"), ok
    for name in ("gdpo", "batched"):
        check = preflight.check_reward(_cfg(tree, f"reward_model.reward_manager={name}"), tree)
        assert check.status == "FAIL" and "\n" not in check.detail
        assert f"verl 0.6.0's trainer has no reward manager {name!r}" in check.detail
        assert "verl.workers.reward_manager, which registers batch, dapo, naive, prime" in check.detail


def test_a_manager_the_custom_reward_file_registers_counts(pristine_base, tmp_path):
    """verl loads the custom reward file before it looks the manager up (reward.py's load_reward_manager), so a
    manager that file registers is there when the name is looked up."""
    tree = pristine_base("0.6.0")
    mine = tmp_path / "my_reward.py"
    mine.write_text(
        "from verl.workers.reward_manager import register\n\n\n"
        '@register("mine")\nclass Mine:\n    pass\n\n\n'
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    cfg = _cfg(tree, f"custom_reward_function.path={mine}", "reward_model.reward_manager=mine")
    assert preflight.check_reward_manager(cfg, tree, mine) is None
    cfg = _cfg(tree, f"custom_reward_function.path={mine}", "reward_model.reward_manager=theirs")
    assert (
        "registers batch, dapo, mine, naive, prime" in preflight.check_reward_manager(cfg, tree, mine).detail
    )


def _readme_settings() -> dict[str, list[str]]:
    """The reward overrides the recipe README gives, by the comment line above them: 'every base', '0.6.0', '0.7.1'."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index("# verl, every base") :]
    block = block[: block.index("```")]
    settings: dict[str, list[str]] = {}
    key, heading = None, False
    for line in block.splitlines():
        if line.startswith("# verl"):
            key = "every" if "every base" in line else re.search(r"verl (\d+\.\d+\.\d+)", line).group(1)
            settings[key], heading = [], True
        elif line.startswith("#"):
            key = key if heading else None  # a heading's second line, else another topic
        elif key and line.strip():
            settings[key] += [w for w in line.split("#")[0].split() if "=" in w]
            heading = False
    return settings


def test_the_readme_gives_settings_for_each_base():
    settings = _readme_settings()
    assert set(settings) == {"every", "0.6.0", "0.7.1"}, settings
    assert settings["0.6.0"] == [
        "reward_model.reward_manager=batch",
        "custom_reward_function.name=compute_score_batch",
    ]
    assert settings["0.7.1"] == ["reward.num_workers=8"]
    assert not any("reward_manager" in s for s in settings["every"] + settings["0.7.1"])


@pytest.mark.parametrize(
    "base,settings,refused",
    [("0.7.1", "0.6.0", True), ("0.7.1", "0.7.1", False), ("0.6.0", "0.6.0", False)],
    ids=["batch-on-0.7.1", "0.7.1-settings", "0.6.0-settings"],
)
def test_the_launcher_dry_run_on_each_base(tmp_path, pristine_base, base, settings, refused):
    """The README's batch line, dry-run through the single-card launcher: refused on 0.7.1 (no batch reward manager there) before
    anything starts, taken on 0.6.0; the README's 0.7.1 line is taken on 0.7.1."""
    given = _readme_settings()
    args = [a for a in given["every"] if not a.startswith("custom_reward_function.path=")] + given[settings]
    env = launcher_env(tmp_path, pristine_base(base), VERL_BASE=base)
    proc = run_launcher(QWEN, ["--dry-run", *args], env)
    assert "Traceback" not in proc.stdout + proc.stderr
    if refused:
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("preflight: error:")]
        assert len(errors) == 1 and "has no reward manager 'batch'" in errors[0], proc.stderr
        assert "(batch reward manager)" not in proc.stdout and "command (" not in proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        manager = "batch" if settings == "0.6.0" else "naive"
        assert f"({manager} reward manager)" in proc.stdout
