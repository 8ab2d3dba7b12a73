"""The test tiers (CONTRIBUTING.md): a training run started by a test without a tier marker is refused, collection
stops on an e2e test without one, and the closing table reads what the fixtures recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import conftest
import tier_report
from ascend_rl.harness import launch

REPO = Path(__file__).resolve().parents[2]


def test_a_test_without_a_tier_cannot_start_a_training_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/x/test_y.py::test_z (call)")
    monkeypatch.setenv("RECIPES_TEST_TIER", "")
    with pytest.raises(
        launch.HarnessError, match=r"test_y.py::test_z starts a training run but carries no tier"
    ):
        launch.launch("r", REPO / "no-launcher.sh", [], tmp_path / "out", tmp_path, tmp_path, timeout_s=5)
    assert not (tmp_path / "out").exists(), "the refusal comes before the run's folder is made"
    monkeypatch.setenv("RECIPES_TEST_TIER", "ci")
    launch.check_test_tier()  # a marked test may
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setenv("RECIPES_TEST_TIER", "")
    launch.check_test_tier()  # outside pytest (make e2e, a user) nothing is asked


def test_this_test_runs_with_no_tier_and_its_children_see_that(tmp_path):
    """conftest.py sets RECIPES_TEST_TIER for each test: this one has no marker, so a harness process it starts
    refuses a training run in one line."""
    refuse = (
        "from ascend_rl.harness.launch import check_test_tier, HarnessError\ntry:\n    check_test_tier()\n"
    )
    refuse += "except HarnessError as exc:\n    raise SystemExit(str(exc))\n"
    proc = subprocess.run(
        [sys.executable, "-c", refuse],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "carries no tier marker" in proc.stderr


@pytest.mark.ci
def test_a_marked_test_sets_its_tier(monkeypatch):
    import os

    assert os.environ["RECIPES_TEST_TIER"] == "ci"


def _item(nodeid: str, fixtures: list[str], marker: str | None = None):
    return SimpleNamespace(
        nodeid=nodeid,
        fixturenames=fixtures,
        get_closest_marker=lambda name: object() if name == marker else None,
    )


def test_collection_stops_on_an_e2e_test_without_a_tier():
    items = [
        _item("tests/a/test_a.py::t", ["tmp_path"]),
        _item("tests/b/test_b.py::t", ["e2e_python"], "full"),
    ]
    conftest.pytest_collection_modifyitems(None, items)  # untiered but not e2e, and e2e with a tier: fine
    items.append(_item("tests/c/test_c.py::t", ["e2e_python", "tmp_path"]))
    with pytest.raises(pytest.UsageError, match=r"1 tests use the e2e environment .* tests/c/test_c.py::t"):
        conftest.pytest_collection_modifyitems(None, items)


def test_the_long_units_come_first():
    items = [
        _item("tests/overlay/test_overlay.py::t", []),
        _item("tests/harness/test_evaluate.py::t", ["e2e_python"], "ci"),
        _item("tests/harness/test_e2e.py::t", ["e2e_python"], "ci"),
        _item("tests/harness/test_faults.py::t", ["e2e_python"], "ci"),
    ]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid.split("/")[-1] for i in items] == [
        "test_faults.py::t",
        "test_e2e.py::t",
        "test_evaluate.py::t",
        "test_overlay.py::t",
    ]


def test_the_table_reads_every_recorded_run(tmp_path, monkeypatch):
    path = tmp_path / "report.jsonl"
    monkeypatch.setenv(tier_report.ENV, str(path))
    monkeypatch.setenv("RECIPES_TEST_TIER", "full")
    summary = {
        "weight_sync_disabled": False,
        "runs": {"sync": {"wall_s": 101.4, "peak_pss_gib": 5.04, "peak_rss_gib": 8.2}},
        "checks": [
            {"run": "sync", "check": "steps", "ok": True},
            {"run": "sync", "check": "weight sync", "ok": False},
        ],
    }
    tier_report.record_e2e("test_e2e", summary, ["sync", "async"])
    nosync = {**summary, "weight_sync_disabled": True}
    tier_report.record_e2e("test_e2e", nosync, ["sync"])
    tier_report.record("test_faults", "qwen2_5 0.7.1 group@save + rerun", True, 250.0, 6.5, 9.0)
    rows = tier_report.read(path)
    assert [(r["run"], r["ok"], r["tier"]) for r in rows] == [
        ("sync", False, "full"),  # one check failed
        ("async", False, "full"),  # never ran
        ("sync, sync disabled", True, "full"),  # the negative control passes when the sync check fails
        ("qwen2_5 0.7.1 group@save + rerun", True, "full"),
    ]
    text = tier_report.table(rows)
    assert "sync, sync disabled" in text and " 101 " in text and "5.0" in text and "8.2" in text
    assert text.splitlines()[-1].startswith("4 runs, 2 failed; 453 s of runs in all; largest peak 6.5 GiB")
    json.dumps(rows)  # plain data
