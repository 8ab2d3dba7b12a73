"""The table `make test` and `make test-full` end with: each whole training run or kill a test started, whether it
passed its checks, its wall time and peak memory (PSS, the real figure; summed RSS beside it).

A fixture that runs the harness calls record() for each run it read back; conftest.py gives every pytest process
the same report file (RECIPES_TIER_REPORT, inherited by the xdist workers) and prints the table at the end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "RECIPES_TIER_REPORT"


def record(
    unit: str, name: str, ok: bool, wall_s: float | None, pss_gib: float | None, rss_gib: float | None = None
) -> None:
    """Append one run's row (one short line: an O_APPEND write lands whole however many workers write)."""
    path = os.environ.get(ENV)
    if not path:
        return
    row = {
        "unit": unit,
        "run": name,
        "ok": bool(ok),
        "wall_s": wall_s,
        "pss_gib": pss_gib,
        "rss_gib": rss_gib,
        "tier": os.environ.get("RECIPES_TEST_TIER", ""),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def record_e2e(unit: str, summary: dict, runs: list[str]) -> None:
    """The rows of an e2e command's summary.json: a run passes when every check on it held."""
    for name in runs:
        run = summary.get("runs", {}).get(name)
        if run is None:  # the command failed before the run wrote anything
            record(
                unit,
                name + (", sync disabled" if summary.get("weight_sync_disabled") else ""),
                False,
                None,
                None,
            )
            continue
        checks = [c["ok"] for c in summary.get("checks", []) if c["run"] == name]
        ok = bool(checks) and all(checks)
        label = name
        if summary.get("weight_sync_disabled"):  # the negative control passes when the sync check fails
            ok = any(
                not c["ok"] for c in summary["checks"] if c["run"] == name and c["check"] == "weight sync"
            )
            label = f"{name}, sync disabled"
        elif summary.get("old_log_prob_recomputed"):  # the skip's control: passes when one forward fails
            ok = any(
                not c["ok"] for c in summary["checks"] if c["run"] == name and c["check"] == "one forward"
            )
            label = f"{name}, old-log-prob recomputed"
        record(unit, label, ok, run.get("wall_s"), run.get("peak_pss_gib"), run.get("peak_rss_gib"))


def read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    head = f"{'tier':<5} {'unit':<14} {'run or kill':<34} {'result':<6} {'wall s':>7} {'PSS GiB':>8} {'RSS GiB':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['tier'] or '-':<5} {r['unit']:<14} {r['run']:<34} {'pass' if r['ok'] else 'FAIL':<6} "
            f"{_fmt(r['wall_s'], '.0f'):>7} {_fmt(r['pss_gib'], '.1f'):>8} {_fmt(r['rss_gib'], '.1f'):>8}"
        )
    total = sum(r["wall_s"] or 0 for r in rows)
    peak = max((r["pss_gib"] or 0 for r in rows), default=0)
    lines.append(
        f"{len(rows)} runs, {sum(not r['ok'] for r in rows)} failed; {total:.0f} s of runs in all; "
        f"largest peak {peak:.1f} GiB (PSS: pages shared by n processes count 1/n; RSS counts them n times)"
    )
    return "\n".join(lines)
