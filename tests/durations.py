"""The durations record of a test tier (pytest plugin; tests/conftest.py registers it): where each tier's time goes.

scripts/run_tests.sh sets RECIPES_DURATIONS_OUT to tests/durations/<tier>.tsv; at the end of the run this writes
there, per test file, the seconds its tests took (set-up, call and tear-down of each, summed; with pytest-xdist the
workers' reports reach the controller's hooks) and how many tests ran, the longest first, under a header that says
when, on what CPU, with how many workers and how long pytest took as a whole. The file is committed after a measured
run, so a change that moves a test between tiers, or makes one slower, shows in its diff. Nothing is written when the
variable is unset or no test ran.
"""

from __future__ import annotations

import os
import platform
import time
from collections import defaultdict
from pathlib import Path

ENV = "RECIPES_DURATIONS_OUT"


def cpu_line() -> str:
    """The CPU the figures were taken on: its model name, its cores and whether it has AVX-512 (vLLM's CPU MoE path
    differs: the grouped GEMM with it, a torch loop without)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {os.cpu_count()} cores, {isa}"


def render(
    per_file: dict[str, list[float]],
    tier: str,
    wall_s: float,
    workers: str,
    when: str,
    cpu: str,
    load: str = "",
) -> str:
    """The record: a header of # lines, then `seconds<TAB>tests<TAB>file` rows, the longest first. `load` says how busy
    the machine was (other work beside the tests inflates every figure)."""
    rows = sorted(per_file.items(), key=lambda item: (-sum(item[1]), item[0]))
    total = sum(sum(times) for times in per_file.values())
    lines = [
        f"# tier {tier}: {sum(len(t) for t in per_file.values())} tests in {len(per_file)} files; pytest wall "
        f"{wall_s:.0f} s on {workers} worker(s), {total:.0f} s of test time",
        f"# measured {when} on {cpu}{load}",
        "# seconds\ttests\tfile",
    ]
    lines += [f"{sum(times):.1f}\t{len(times)}\t{path}" for path, times in rows]
    return "\n".join(lines) + "\n"


class Recorder:
    def __init__(self, out: Path, tier: str, workers: str) -> None:
        self.out, self.tier, self.workers = out, tier, workers
        self.start = time.monotonic()
        self.tests: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.tests[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        per_file: dict[str, list[float]] = defaultdict(list)
        for nodeid, seconds in self.tests.items():
            per_file[nodeid.split("::", 1)[0]].append(seconds)
        if not per_file:
            return
        text = render(
            per_file,
            self.tier,
            time.monotonic() - self.start,
            self.workers,
            time.strftime("%Y-%m-%d", time.gmtime()),
            cpu_line(),
            f"; load average over the last 15 minutes at the end {os.getloadavg()[2]:.1f}",
        )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(f".{self.out.name}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.out)


def pytest_configure(config) -> None:
    out = os.environ.get(ENV)
    # the controller only (an xdist worker has workerinput): it sees every worker's reports
    if out and not hasattr(config, "workerinput"):
        tier = "ci" if config.getoption("markexpr", "") == "not full" else "full"
        workers = str(getattr(config.option, "numprocesses", None) or 1)
        config.pluginmanager.register(Recorder(Path(out), tier, workers), "recipes-durations")
