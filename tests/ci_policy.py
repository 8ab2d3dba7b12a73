"""In CI a skip that hides a failure is a failure (pytest plugin; tests/conftest.py registers it).

- get_artifact(what, fn, *args): an artifact from the package index. A distribution the index does not have (a
  wrong pin) fails the test everywhere; an index that cannot be reached skips it locally and fails it under CI=true.
- require(module): a required dev dependency. Missing, it skips locally; under CI=true it fails.
- At the end of the run a section lists every skip with its reason; under CI=true a skip whose reason carries one of
  the prefixes below (an unreachable index, a missing required dependency) makes the run's exit status non-zero,
  whoever raised it (with pytest-xdist the workers' reports reach the controller's hooks).

Other skips (needs root, a tool this machine lacks, a test that skips by design) stay skips.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import pytest

from ascend_rl import artifacts

UNREACHABLE = "[unreachable index]"
MISSING_DEPENDENCY = "[missing dependency]"
POLICY_PREFIXES = (UNREACHABLE, MISSING_DEPENDENCY)


def in_ci() -> bool:
    """CI=true (what CI services set), where a policy skip is a failure."""
    return os.environ.get("CI", "").strip().lower() == "true"


def unreachable(what: str, exc: BaseException | str) -> None:
    """Skip (locally) or fail (CI=true): `what` cannot be had because the package index cannot be reached."""
    __tracebackhide__ = True  # the skip's location is the caller's
    reason = f"{UNREACHABLE} {what}: {exc}"
    if in_ci():
        pytest.fail(f"{reason} (CI=true: an unreachable index fails the run)", pytrace=False)
    pytest.skip(reason)


def get_artifact(what: str, fn, *args):
    """fn(*args), an artifact from the package index; a missing distribution or another pip failure fails the
    test, an unreachable index skips it (locally) or fails it (CI=true), with the one-line reason."""
    __tracebackhide__ = True
    try:
        return fn(*args)
    except artifacts.DownloadError as exc:
        error = exc  # the verdict below, outside the except: the report is the one line, not a chain
    if isinstance(error, artifacts.IndexUnreachable):
        unreachable(what, error)
    if isinstance(error, artifacts.DistributionMissing):
        pytest.fail(f"{what}: {error}", pytrace=False)
    pytest.fail(
        f"{what} cannot be had: {error}", pytrace=False
    )  # neither: not the network's doing, not a skip


def artifact_error_in(what: str, output: str) -> None:
    """For a subprocess whose failure came from the artifacts module: the same verdict as get_artifact, read from
    its output (the exception's last traceback line). Output naming no such error fails the test."""
    __tracebackhide__ = True
    for line in reversed(output.splitlines()):
        for name in ("IndexUnreachable", "DistributionMissing", "DownloadError"):
            marker = f"ascend_rl.artifacts.{name}: "
            if marker in line:
                message = line.split(marker, 1)[1].strip()
                if name == "IndexUnreachable":
                    unreachable(what, message)
                pytest.fail(f"{what}: {message}", pytrace=False)
    pytest.fail(f"{what} cannot be had:\n{output[-2000:]}", pytrace=False)


def require(module: str, why: str = "") -> ModuleType:
    """Import a required dev dependency (requirements-dev.txt), in place of pytest.importorskip. Missing, it
    skips with the reason; under CI=true it fails: inside a test or fixture at once, at a module's top level as a
    policy skip that fails the run at its end (a collection error would stop the whole run)."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = f"{MISSING_DEPENDENCY} {module} cannot be imported ({exc})" + (f": {why}" if why else "")
    at_top = sys._getframe(1).f_code.co_name == "<module>"
    if in_ci() and not at_top:
        pytest.fail(f"{reason} (CI=true: a missing required dependency fails the run)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text.removeprefix("Skipped: ")


class _Skips:
    def __init__(self, config) -> None:
        self.config = config
        self.skips: dict[tuple[str, str], None] = {}  # (nodeid, reason), in the order seen

    def _record(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.setdefault((report.nodeid, _reason(report)), None)

    def pytest_runtest_logreport(self, report) -> None:
        self._record(report)

    def pytest_collectreport(self, report) -> None:
        self._record(report)

    def policy_skips(self) -> list[tuple[str, str]]:
        return [(node, why) for node, why in self.skips if why.startswith(POLICY_PREFIXES)]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.skips:
            return
        tr = terminalreporter
        tr.write_sep("=", f"skips ({len(self.skips)}), each with its reason")
        for node, why in self.skips:
            tr.write_line(f"SKIP {node}: {why}")
        failing = self.policy_skips()
        if failing and in_ci():
            tr.write_sep(
                "=",
                f"CI policy: {len(failing)} skip(s) hide a failure (an unreachable index or a missing required "
                "dependency); the run fails",
                red=True,
            )
            for node, why in failing:
                tr.write_line(f"FAIL {node}: {why}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        quiet = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)  # what would read as no failure
        if in_ci() and self.policy_skips() and session.exitstatus in quiet:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its reports go to the controller, which decides
        return
    config.pluginmanager.register(_Skips(config), "ci_policy_skips")
