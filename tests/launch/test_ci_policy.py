"""A skip that hides a failure is a failure in CI (issue 34, item 6).

ascend_rl.artifacts tells a distribution the index does not have (DistributionMissing: the pin is wrong) from an index
that cannot be reached (IndexUnreachable: the network), on real pip runs: the missing pin asks the real PyPI for a
vllm version that does not exist (--no-deps, nothing downloaded), the unreachable index is a local port nothing
listens on. tests/ci_policy.py turns them into a failure, a skip, or (CI=true) a failure, and lists every skip at the
end of the run; its behaviour is shown on a throwaway suite run by pytest in a subprocess, with and without CI=true,
in one process and on two xdist workers.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ci_policy
from ascend_rl import artifacts

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
WRONG_PIN = "0.13.99"  # vllm has 0.13.0 and 0.14.0, never 0.13.99
REFUSED = "http://127.0.0.1:9/simple"  # the discard port: nothing listens on it here


@pytest.fixture
def pip_env(monkeypatch, tmp_path):
    """An empty download cache; pip with one retry and a short timeout, its config files off (the index is set)."""
    monkeypatch.setenv("RECIPES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("PIP_RETRIES", "1"), ("PIP_TIMEOUT", "30"), ("PIP_DEFAULT_TIMEOUT", "30")):
        monkeypatch.setenv(name, value)
    return monkeypatch


def _error(fn, *args) -> artifacts.DownloadError:
    with pytest.raises(artifacts.DownloadError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    return info.value


def _against_pypi(fn, *args) -> artifacts.DownloadError:
    """The error from the real PyPI; PyPI out of reach is the policy's business (a skip here, a failure in CI)."""
    exc = _error(fn, *args)
    if isinstance(exc, artifacts.IndexUnreachable):
        ci_policy.unreachable("PyPI, to show a missing pin", exc)
    return exc


@pytest.mark.slow
def test_a_pin_pypi_does_not_have_is_a_missing_distribution(pip_env):
    exc = _against_pypi(artifacts.wheel, "vllm", WRONG_PIN)
    assert type(exc) is artifacts.DistributionMissing
    assert str(exc) == (
        f"vllm=={WRONG_PIN} is not on the package index (No matching distribution found for vllm=={WRONG_PIN}): "
        "the pin is wrong"
    )
    assert "network" not in str(exc)


@pytest.mark.slow
def test_a_megatron_pin_pypi_does_not_have_is_a_missing_distribution(pip_env):
    pip_env.setattr(artifacts, "pinned", lambda name, constraints=None: "0.0.0.99")
    exc = _against_pypi(artifacts.megatron_packages, Path(sys.executable))
    assert type(exc) is artifacts.DistributionMissing
    assert str(exc).startswith("megatron-core==0.0.0.99 mbridge==0.0.0.99 is not on the package index (")
    assert "No matching distribution found for" in str(exc) and str(exc).endswith("the pin is wrong")


def test_an_index_that_refuses_the_connection_is_unreachable(pip_env):
    pip_env.setenv("PIP_INDEX_URL", REFUSED)
    exc = _error(artifacts.wheel, "vllm", WRONG_PIN)  # pip says "No matching distribution found" here too
    assert type(exc) is artifacts.IndexUnreachable
    assert str(exc) == (
        f"vllm=={WRONG_PIN}: cannot reach the package index ({REFUSED}/vllm/: [Errno 111] Connection refused): "
        "check the network"
    )


def test_megatron_packages_from_an_index_that_refuses_the_connection_is_unreachable(pip_env):
    pip_env.setenv("PIP_INDEX_URL", REFUSED)
    exc = _error(artifacts.megatron_packages, Path(sys.executable))
    assert type(exc) is artifacts.IndexUnreachable
    assert "cannot reach the package index" in str(exc) and "Connection refused" in str(exc)
    assert not list((Path(os.environ["RECIPES_CACHE"])).glob("megatron-*"))  # nothing half-built is kept


def _simple_index(
    root: Path, project: str, files: dict[str, bytes], digests: dict[str, str] | None = None
) -> str:
    """A PEP 503 index on disk holding `files` for `project` (each linked with its sha256, or the one given)."""
    page = root / project
    page.mkdir(parents=True)
    links = []
    for name, data in files.items():
        (page / name).write_bytes(data)
        digest = (digests or {}).get(name) or hashlib.sha256(data).hexdigest()
        links.append(f'<a href="{name}#sha256={digest}">{name}</a>')
    (page / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root.as_uri()


def test_a_file_pip_would_build_is_fetched_by_name_checked_and_cached(pip_env, tmp_path):
    pip_env.setenv(
        "PIP_INDEX_URL", _simple_index(tmp_path / "index", "pkg-x", {"pkg_x-1.0.tar.gz": b"sdist"})
    )
    got = artifacts.index_file("pkg_x", "pkg_x-1.0.tar.gz")
    assert got.read_bytes() == b"sdist" and got.parent == artifacts.cache_dir()
    (tmp_path / "index" / "pkg-x" / "pkg_x-1.0.tar.gz").unlink()  # cached: the index is not asked again
    assert artifacts.index_file("pkg_x", "pkg_x-1.0.tar.gz") == got
    missing = _error(artifacts.index_file, "pkg_x", "pkg_x-9.9.tar.gz")
    assert type(
        missing
    ) is artifacts.DistributionMissing and "pkg_x-9.9.tar.gz is not on the package index" in str(missing)
    with pytest.raises(artifacts.ChecksumError):
        artifacts.index_file("pkg_x", "pkg_x-1.0.tar.gz", sha256="0" * 64)


def test_a_file_that_does_not_match_the_index_digest_is_not_kept(pip_env, tmp_path):
    name = "pkg_y-1.0.tar.gz"
    pip_env.setenv(
        "PIP_INDEX_URL", _simple_index(tmp_path / "index", "pkg-y", {name: b"y"}, {name: "1" * 64})
    )
    with pytest.raises(artifacts.ChecksumError, match="does not match the index's sha256"):
        artifacts.index_file("pkg-y", name)
    assert not (artifacts.cache_dir() / name).exists()


def test_a_file_from_an_index_that_refuses_the_connection_is_unreachable(pip_env):
    pip_env.setenv("PIP_INDEX_URL", REFUSED)
    exc = _error(artifacts.index_file, "vllm-ascend", "vllm_ascend-0.23.0.post1.tar.gz")
    assert type(exc) is artifacts.IndexUnreachable
    assert str(exc) == (
        f"vllm-ascend: cannot reach the package index ({REFUSED}/vllm-ascend/: [Errno 111] Connection refused): "
        "check the network"
    )


def test_a_name_that_does_not_resolve_is_unreachable(pip_env):
    # .invalid never resolves (RFC 2606)
    pip_env.setenv("PIP_INDEX_URL", "https://no-such-host.invalid/simple")
    exc = _error(artifacts.wheel, "vllm", WRONG_PIN)
    assert type(exc) is artifacts.IndexUnreachable
    assert "cannot reach the package index (https://no-such-host.invalid/simple/vllm/: " in str(exc)


@pytest.mark.slow
def test_a_pin_is_not_judged_missing_while_one_of_the_indexes_was_not_asked(pip_env):
    # PyPI answers "no such version"; the other index never answers
    pip_env.setenv("PIP_EXTRA_INDEX_URL", REFUSED)
    exc = _error(artifacts.wheel, "vllm", WRONG_PIN)
    assert type(exc) is artifacts.IndexUnreachable, exc


def test_an_artifact_error_in_a_subprocess_gets_the_same_verdict(pip_env):
    """As the DeepSeek launcher's --cpu path fails when megatron_packages does (tests/launch/test_preflight_refusals.py)."""
    pip_env.setenv("PIP_INDEX_URL", REFUSED)
    code = "import sys; from pathlib import Path; from ascend_rl import artifacts; "
    code += "artifacts.megatron_packages(Path(sys.executable))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "ascend_rl.artifacts.IndexUnreachable: megatron-core==" in proc.stderr
    pip_env.delenv("CI", raising=False)
    with pytest.raises(
        pytest.skip.Exception, match=r"^\[unreachable index\] megatron-core: megatron-core==\S+ "
    ):
        ci_policy.artifact_error_in("megatron-core", proc.stderr)
    missing = (
        "Traceback (most recent call last):\n  ...\nascend_rl.artifacts.DistributionMissing: x==1 is not on "
    )
    missing += "the package index (No matching distribution found for x==1): the pin is wrong\n"
    with pytest.raises(
        pytest.fail.Exception, match=r"^x: x==1 is not on the package index .*: the pin is wrong$"
    ):
        ci_policy.artifact_error_in("x", missing)
    with pytest.raises(pytest.fail.Exception, match="cannot be had"):
        ci_policy.artifact_error_in("x", "Segmentation fault")
    pip_env.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"\(CI=true: an unreachable index fails the run\)$"):
        ci_policy.artifact_error_in("megatron-core", proc.stderr)


# pip's output for the cases a real run here does not give cheaply (the log lines as its --log file has them).
NOT_FOUND = (
    "ERROR: Could not find a version that satisfies the requirement x==1 (from versions: none)\n"
    "ERROR: No matching distribution found for x==1\n"
)


@pytest.mark.parametrize(
    ("output", "log", "kind", "says"),
    [
        # PyPI answers 404 for a project it does not have: an answer, so the pin is wrong
        (
            NOT_FOUND,
            "Could not fetch URL https://pypi.org/simple/x/: 404 Client Error: Not Found for url: "
            "https://pypi.org/simple/x/ - skipping",
            artifacts.DistributionMissing,
            "x==1 is not on the package index (No matching distribution found for x==1): the pin is wrong",
        ),
        (
            NOT_FOUND,
            "Could not fetch URL https://pypi.org/simple/x/: 503 Server Error: Service Unavailable for url: "
            "https://pypi.org/simple/x/ - skipping",
            artifacts.IndexUnreachable,
            "x==1: cannot reach the package index (https://pypi.org/simple/x/: 503 Server Error: Service "
            "Unavailable for url: https://pypi.org/simple/x/): check the network",
        ),
        (
            NOT_FOUND,
            "Could not fetch URL https://pypi.org/simple/x/: connection error: HTTPSConnectionPool(host='pypi.org', "
            "port=443): Max retries exceeded with url: /simple/x/ (Caused by NewConnectionError('<...>: Failed to "
            "establish a new connection: [Errno -3] Temporary failure in name resolution')) - skipping",
            artifacts.IndexUnreachable,
            "x==1: cannot reach the package index (https://pypi.org/simple/x/: [Errno -3] Temporary failure in "
            "name resolution): check the network",
        ),
        # the index answered, then the download broke off
        (
            "Collecting x==1\n  Downloading x-1-py3-none-any.whl (100 MB)\nERROR: Exception:\nTraceback ...\n"
            "pip._vendor.urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='files.pythonhosted.org', "
            "port=443): Read timed out.\n",
            "",
            artifacts.IndexUnreachable,
            "x==1: cannot reach the package index (Read timed out): check the network",
        ),
        # neither: not the network's doing, and not a verdict on the pin
        (
            "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n",
            "",
            artifacts.DownloadError,
            "pip could not get x==1 (ERROR: Could not install packages due to an OSError: [Errno 28] No space "
            "left on device)",
        ),
    ],
    ids=["404-is-an-answer", "503", "name-resolution", "download-broke-off", "other"],
)
def test_pip_output_is_classified(output, log, kind, says):
    exc = artifacts.pip_failure("x==1", output, log)
    assert type(exc) is kind and str(exc) == says


def test_a_pip_that_gives_no_answer_in_time_is_unreachable(pip_env, tmp_path):
    pip_env.setenv("PIP_INDEX_URL", REFUSED)
    with pytest.raises(artifacts.IndexUnreachable, match=r"pip had no answer in 0s\): check the network$"):
        artifacts.fetch_file("x-*.whl", "x==1", binary=True, timeout=0)


# The plugin, on a throwaway suite. ci_policy comes from tests/ (PYTHONPATH), as tests/conftest.py's sys.path entry
# gives it to the real suite.
CASES = """
import pytest

from ascend_rl import artifacts
from ci_policy import UNREACHABLE, get_artifact, require


def _missing():
    raise artifacts.DistributionMissing(
        "vllm==0.13.99 is not on the package index (No matching distribution found for vllm==0.13.99): the pin is wrong"
    )


def _unreachable():
    raise artifacts.IndexUnreachable(
        "vllm==9.9.9: cannot reach the package index (http://127.0.0.1:9/simple/vllm/: [Errno 111] Connection "
        "refused): check the network"
    )


@pytest.fixture(scope="session")
def missing_wheel():
    return get_artifact("vllm 0.13.99 wheel", _missing)


@pytest.fixture(scope="session")
def far_wheel():
    return get_artifact("vllm 9.9.9 wheel", _unreachable)


def test_missing_a(missing_wheel):
    pass


def test_missing_b(missing_wheel):
    pass


def test_far(far_wheel):
    pass


def test_needs_root():
    pytest.skip("needs root")


def test_dependency():
    require("no_such_module_ci_policy_a", "requirements-dev.txt pins it")


def test_raw_policy_skip():
    pytest.skip(f"{UNREACHABLE} something fetched by hand: no network")


def test_passes():
    pass
"""

TOP = """
from ci_policy import require

require("no_such_module_ci_policy_b", "requirements-dev.txt pins it")


def test_never_runs():
    pass
"""

BY_DESIGN = """
import pytest


def test_needs_root():
    pytest.skip("needs root")


def test_passes():
    pass
"""


def _suite(root: Path, files: dict[str, str], register: bool) -> Path:
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")  # its own rootdir, not the repository's pyproject.toml
    if register:  # as tests/conftest.py does it
        (root / "conftest.py").write_text('pytest_plugins = ["ci_policy"]\n')
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def _pytest(root: Path, *args: str, ci: bool, register: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO)])
    env["COLUMNS"] = "400"  # the short summary's lines whole
    if ci:
        env["CI"] = "true"
    plugin = [] if register else ["-p", "ci_policy"]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        *plugin,
        "-rfEs",
        "-o",
        "console_output_style=classic",
    ]
    return subprocess.run([*cmd, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _section(out: str) -> list[str]:
    """The skip list: its lines, and that it comes after every test's result (only pytest's summary follows)."""
    lines = out.splitlines()
    [start] = [i for i, ln in enumerate(lines) if "each with its reason" in ln]
    assert not [ln for ln in lines[start:] if ln.startswith(("test_", "_____"))], out
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("=")),
        len(lines),
    )
    return lines[start + 1 : end]


LOCAL_SKIPS = [
    "SKIP test_cases.py::test_far: [unreachable index] vllm 9.9.9 wheel: vllm==9.9.9: cannot reach the package "
    "index (http://127.0.0.1:9/simple/vllm/: [Errno 111] Connection refused): check the network",
    "SKIP test_cases.py::test_needs_root: needs root",
    "SKIP test_cases.py::test_dependency: [missing dependency] no_such_module_ci_policy_a cannot be imported (No "
    "module named 'no_such_module_ci_policy_a'): requirements-dev.txt pins it",
    "SKIP test_cases.py::test_raw_policy_skip: [unreachable index] something fetched by hand: no network",
]


def test_locally_a_missing_distribution_fails_and_an_unreachable_index_skips(tmp_path):
    root = _suite(tmp_path / "suite", {"test_cases.py": CASES}, register=False)
    proc = _pytest(root, "-n", "0", ci=False)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert out.splitlines()[-1].strip("= ").startswith("1 passed, 4 skipped, 2 errors"), out
    # the session fixture's one line, for each test using it
    for test in ("test_missing_a", "test_missing_b"):
        assert (
            f"ERROR test_cases.py::{test} - Failed: vllm 0.13.99 wheel: vllm==0.13.99 is not on the package index "
            "(No matching distribution found for vllm==0.13.99): the pin is wrong"
        ) in out, out
    assert _section(out) == LOCAL_SKIPS
    assert "CI policy" not in out
    # one line each, no exception chain, and the skips located where they were asked for, not in the plugin
    assert "During handling" not in out and "ci_policy.py" not in out, out
    assert "SKIPPED [1] test_cases.py:" in out


def test_under_ci_an_unreachable_index_and_a_missing_dependency_fail(tmp_path):
    root = _suite(tmp_path / "suite", {"test_cases.py": CASES, "test_top.py": TOP}, register=False)
    proc = _pytest(root, "-n", "0", ci=True)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "[unreachable index] vllm 9.9.9 wheel: vllm==9.9.9: cannot reach the package index" in out
    assert "(CI=true: an unreachable index fails the run)" in out
    assert "(CI=true: a missing required dependency fails the run)" in out
    skips = _section(out)
    assert skips == [
        "SKIP test_top.py: [missing dependency] no_such_module_ci_policy_b cannot be imported (No module named "
        "'no_such_module_ci_policy_b'): requirements-dev.txt pins it",
        "SKIP test_cases.py::test_needs_root: needs root",
        "SKIP test_cases.py::test_raw_policy_skip: [unreachable index] something fetched by hand: no network",
    ], out
    assert "CI policy: 2 skip(s) hide a failure" in out
    assert "FAIL test_cases.py::test_raw_policy_skip: [unreachable index]" in out
    assert "FAIL test_top.py: [missing dependency]" in out
    assert "FAIL test_cases.py::test_needs_root" not in out


@pytest.mark.parametrize("register", [False, True], ids=["-p", "pytest_plugins"])
def test_under_ci_policy_skips_alone_fail_the_run_on_xdist_workers(tmp_path, register):
    files = {"test_top.py": TOP, "test_by_design.py": BY_DESIGN, "test_cases.py": CASES}
    root = _suite(tmp_path / "suite", files, register=register)
    only_skips = ["-k", "not missing and not far and not dependency"]  # no test fails: only skips are left
    proc = _pytest(root, "-n", "2", *only_skips, ci=True, register=register)
    out = proc.stdout
    assert "2 workers" in out or "created: 2/2 workers" in out, out
    assert "failed" not in out.splitlines()[-1], out  # every test passed or skipped ...
    assert proc.returncode == 1, out  # ... and still the run fails
    assert "CI policy: 2 skip(s) hide a failure" in out
    assert sorted(_section(out)) == sorted(
        [
            "SKIP test_top.py: [missing dependency] no_such_module_ci_policy_b cannot be imported (No module named "
            "'no_such_module_ci_policy_b'): requirements-dev.txt pins it",
            "SKIP test_by_design.py::test_needs_root: needs root",
            "SKIP test_cases.py::test_needs_root: needs root",
            "SKIP test_cases.py::test_raw_policy_skip: [unreachable index] something fetched by hand: no network",
        ]
    ), out
    if register:  # the rest does not depend on how the plugin is registered
        return
    local = _pytest(root, "-n", "2", *only_skips, ci=False, register=register)
    assert local.returncode == 0 and "CI policy" not in local.stdout, local.stdout
    by_design = _pytest(root, "-n", "2", "test_by_design.py", ci=True, register=register)
    assert by_design.returncode == 0 and "CI policy" not in by_design.stdout, by_design.stdout
    assert _section(by_design.stdout) == ["SKIP test_by_design.py::test_needs_root: needs root"]
