"""The MATH reward under faults: helpers killed in every state, hostile load, a caller that dies.

Each test asserts scores and which processes survive, never how long anything took
(`llm_rl/qwen2_5/bench_reward.py` prints the time figures).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_reward import REWARD_PATH, load_reward, make

# A subscripted letter: the cheap checks read x as a variable, not x_{1}, so these answers go to sympy
# (test_the_answers_here_need_sympy fails first if a cheap check learns to decide them).
X = "x_{1}"
# Correct, but math_verify needs 0.2-0.6 s of CPU: long enough to kill its worker in mid-answer.
SLOW_TRUTH = "+".join(f"{math.comb(12, k)}{X}^{{{k}}}" for k in range(12, 0, -1)) + "+1"
SLOW_RIGHT = make(f"\\boxed{{({X}+1)^{{12}}}}")
SLOW_WRONG = make(f"\\boxed{{({X}-1)^{{12}}}}")


def stuck(k: int) -> str:
    """A hostile answer that passes every cheap check; sympy does not finish it in minutes."""
    return make(f"\\boxed{{\\int_0^{{{k + 2}}} \\sin(x^{{x}}) \\, dx}}")


def ordinary(k: int) -> tuple[str, str, float]:
    """(response, truth, score): answers only math_verify decides, fresh per k so no cache answers them."""
    a, b = 2 + k, 3 + 2 * k
    truth = f"{X}^2+{a + b}{X}+{a * b}"
    if k % 3 == 2:
        return make(f"\\boxed{{({X}+{a})({X}+{b + 1})}}"), truth, 0.0
    return make(f"\\boxed{{({X}+{a})({X}+{b})}}"), truth, 1.0


def test_the_answers_here_need_sympy():
    """These tests are about the helpers: their answers must reach them, past every cheap check."""
    reward = load_reward()
    for response, truth in [ordinary(k)[:2] for k in range(3)] + [(SLOW_RIGHT, SLOW_TRUTH), (stuck(0), "1")]:
        prepared = reward._prepare(response, truth)
        assert reward.fast_verdict(prepared.answer.text, prepared.truths) is None, (response[-40:], truth)


@pytest.fixture
def reward():
    """The module with a fresh pool and an empty verdict cache for each test."""
    module = load_reward()
    module.shutdown()
    module._CACHE.clear()
    yield module
    module.shutdown()
    module._CACHE.clear()


def gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except OSError:
        return True


def wait_gone(pids: list[int], within: float = 2.0) -> list[int]:
    """The pids still alive after `within` seconds (checked often, so a pass returns early)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if not gone(p)]


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert wait_gone(pids) == []


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["result"] = fn(*args, **kwargs)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def wait_for(pool, state: str) -> list[int]:
    """Process ids in `state` ('zygote', 'idle', 'busy') as soon as there are any."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = pool.pids()[state]
        if pids:
            return pids
        time.sleep(0.002)
    raise AssertionError(f"no {state} process appeared")


def score_all(reward, ks) -> list[tuple[float, bool]]:
    out = []
    for k in ks:
        response, truth, _ = ordinary(k)
        result = reward.compute_score_dict("s", response, truth, timeout=2.0)
        out.append((result["score"], result["timed_out"]))
    return out


def expected(ks) -> list[tuple[float, bool]]:
    return [(ordinary(k)[2], False) for k in ks]


def test_idle_workers_killed_the_next_answers_are_scored(reward):
    assert score_all(reward, range(6)) == expected(range(6))
    pool = reward._get_pool()
    idle = pool.pids()["idle"]
    assert idle, "answers that need sympy leave an idle worker behind"
    kill(idle)
    assert score_all(reward, range(6, 12)) == expected(range(6, 12))
    assert not set(idle) & set(pool.pids()["idle"])


def test_busy_worker_killed_mid_answer_the_answer_is_retried(reward):
    reward.compute_score("s", *ordinary(0)[:2])  # the zygote is up
    pool = reward._get_pool()
    thread, out = in_thread(reward.compute_score_dict, "s", SLOW_RIGHT, SLOW_TRUTH, timeout=10.0)
    victim = wait_for(pool, "busy")
    kill(victim)
    thread.join()
    assert out["result"]["score"] == 1.0 and out["result"]["timed_out"] is False
    assert reward.compute_score("s", SLOW_WRONG, SLOW_TRUTH, timeout=10.0) == 0.0


@pytest.mark.parametrize("times", [1, 3])
def test_zygote_killed_while_it_starts_the_answer_is_still_scored(reward, times):
    thread, out = in_thread(score_all, reward, range(4))
    pool = reward._get_pool()
    killed: list[int] = []
    for _ in range(times):  # each replacement is killed too, while it imports math_verify
        pid = wait_for(pool, "zygote")[0]
        while pid in killed:
            pid = wait_for(pool, "zygote")[0]
        kill([pid])
        killed.append(pid)
    thread.join()
    assert out["result"] == expected(range(4))
    assert score_all(reward, range(4, 8)) == expected(range(4, 8))


def test_zygote_killed_its_workers_die_and_the_pool_heals(reward):
    assert score_all(reward, range(3)) == expected(range(3))
    pool = reward._get_pool()
    before = pool.pids()
    kill(before["zygote"])
    assert wait_gone(before["idle"]) == [], "workers die with their zygote"
    assert score_all(reward, range(3, 6)) == expected(range(3, 6))
    assert pool.pids()["zygote"] != before["zygote"]


def test_after_a_timeout_every_helper_killed_again_and_again_nothing_breaks(reward):
    for round_ in range(3):
        result = reward.compute_score_dict("s", stuck(round_), "1", timeout=0.3)
        assert result["timed_out"] is True and result["score"] == 0.0
        pids = reward._get_pool().pids()
        kill(pids["zygote"] + pids["idle"])
        ks = range(10 * round_, 10 * round_ + 3)
        assert score_all(reward, ks) == expected(ks)


def test_hostile_and_ordinary_answers_from_32_threads(reward):
    """20 answers sympy cannot finish and 12 it can, all at once: only the 20 time out."""
    jobs = [(stuck(k), "1", 0.0) for k in range(20)] + [ordinary(k) for k in range(12)]
    random.Random(0).shuffle(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(job):
        barrier.wait()
        return reward.compute_score_dict("s", job[0], job[1], timeout=0.5)

    with ThreadPoolExecutor(max_workers=len(jobs)) as executor:
        results = list(executor.map(run, jobs))
    for job, result in zip(jobs, results, strict=True):
        hostile = "\\int" in job[0]
        assert result["score"] == job[2] and result["timed_out"] is hostile, job[0][-60:]


def test_workers_killed_at_random_while_threads_score(reward):
    """A killer takes out helpers in whatever state they are in; no ordinary answer is scored wrong.

    Fewer deaths than MAX_ATTEMPTS under one answer never cost it its score (more are taken for an answer
    that crashes its worker)."""
    jobs = [ordinary(k) for k in range(40)] + [(SLOW_RIGHT, SLOW_TRUTH, 1.0), (stuck(0), "1", 0.0)]
    stop = threading.Event()
    kills = []

    def killer() -> None:
        rng = random.Random(1)
        while not stop.is_set() and len(kills) < reward.MAX_ATTEMPTS - 2:
            pool = reward._get_pool()
            pids = [p for state in ("idle", "busy", "zygote") for p in pool.pids()[state]]
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with ThreadPoolExecutor(max_workers=8) as executor:
            results = list(
                executor.map(lambda j: reward.compute_score_dict("s", j[0], j[1], timeout=1.0), jobs)
            )
    finally:
        stop.set()
        thread.join()
    assert kills, "the killer found something to kill"
    assert [r["score"] for r in results[:-1]] == [j[2] for j in jobs[:-1]]
    assert results[-1]["score"] == 0.0


CALLER = textwrap.dedent(
    """
    import importlib.util, json, sys, threading, time
    spec = importlib.util.spec_from_file_location("custom_module", {path!r})
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    m.compute_score("s", {warm!r}, {warm_truth!r})
    threading.Thread(target=m.compute_score, args=("s", {stuck!r}, "1"), kwargs={{"timeout": 60}},
                     daemon=True).start()
    pool = m._get_pool()
    while not pool.pids()["busy"]:
        time.sleep(0.01)
    print(json.dumps(pool.pids()), flush=True)
    how = sys.argv[1]
    if how == "exit":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("the caller fails")
    time.sleep(600)  # "sigkill": the test kills this process
    """
)


@pytest.mark.parametrize("how", ["exit", "raise", "sigkill"])
def test_no_helper_outlives_its_caller(tmp_path, how):
    script = tmp_path / "caller.py"
    warm, warm_truth, _ = ordinary(0)  # a worker has answered once before the stuck answer
    script.write_text(CALLER.format(path=str(REWARD_PATH), warm=warm, warm_truth=warm_truth, stuck=stuck(0)))
    proc = subprocess.Popen(
        [sys.executable, str(script), how], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        pids = json.loads(proc.stdout.readline())
        helpers = pids["zygote"] + pids["idle"] + pids["busy"]
        assert len(helpers) >= 2 and pids["busy"]
        if how == "sigkill":
            proc.kill()
        proc.wait(timeout=60)
        assert wait_gone(helpers, within=1.0) == [], f"helpers outlived the caller ({how})"
    finally:
        proc.kill()
        proc.wait()


BROKEN = "raise ImportError('math_verify is broken in this Python')\n"


def _run_reward(code: str, env: dict[str, str] | None = None, python: str = sys.executable, *flags: str):
    return subprocess.run(
        [python, *flags, "-c", textwrap.dedent(code), *FIRST_CALL_ARGS],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


FIRST_CALL = """
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("custom_module", sys.argv[1])
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    response, truth = sys.argv[2], sys.argv[3]  # decided without sympy: the first call raises all the same
    for call in (lambda: m.compute_score("s", response, truth), lambda: m.compute_score_batch(["s"], [response], [truth])):
        try:
            call()
            print(json.dumps({"raised": None}))
        except m.MathVerifyUnavailable as exc:
            print(json.dumps({"raised": str(exc)}))
"""
FIRST_CALL_ARGS = (str(REWARD_PATH), make("\\boxed{0.5}"), "\\frac12")


ENTRY_POINTS = 2  # FIRST_CALL calls compute_score and compute_score_batch, one line each


def _raised(done: subprocess.CompletedProcess) -> list[str | None]:
    """What each entry point raised (None: it returned a score); every entry point must have reported.

    Without the count, a run that printed nothing (an empty list) passed every check below.
    """
    assert done.returncode == 0, done.stderr
    raised = [json.loads(line)["raised"] for line in done.stdout.splitlines()]
    assert len(raised) == ENTRY_POINTS, (
        f"expected one line from each of the {ENTRY_POINTS} entry points, got {done.stdout!r} ({done.stderr!r})"
    )
    return raised


@pytest.mark.parametrize("stdout", ["", json.dumps({"raised": "x"}) + "\n"], ids=["nothing", "one of two"])
def test_a_run_that_reports_too_little_fails_the_check(stdout):
    """The checks on what the first call raised fail when the entry points did not all report."""
    done = subprocess.CompletedProcess(args=[], returncode=0, stdout=stdout, stderr="")
    with pytest.raises(AssertionError, match="expected one line from each of the 2 entry points"):
        _raised(done)


def test_math_verify_that_cannot_import_fails_the_first_call(tmp_path):
    fake = tmp_path / "math_verify"
    fake.mkdir()
    (fake / "__init__.py").write_text(BROKEN)
    raised = _raised(_run_reward(FIRST_CALL, {"PYTHONPATH": str(tmp_path)}))
    for message in raised:  # both entry points, every call: no score is ever given without math_verify
        assert message is not None and "math_verify is broken in this Python" in message
        assert "-m pip install 'math-verify==" in message and "Python >= 3.10" in message


def test_math_verify_not_installed_fails_the_first_call():
    # -S: no site-packages, so no math_verify; the reward itself needs only the standard library
    raised = _raised(_run_reward(FIRST_CALL, None, sys.executable, "-S"))
    assert all(m is not None and "not installed" in m and "pip install 'math-verify==" in m for m in raised)


def test_cli_without_math_verify_exits_non_zero_with_the_install_line(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"response": make("\\boxed{0.5}"), "ground_truth": "\\frac12"}) + "\n")
    done = subprocess.run(
        [sys.executable, "-S", str(REWARD_PATH), "score", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: new_math_reward needs math_verify")
    assert "pip install 'math-verify==" in lines[0]


def test_a_python_older_than_the_minimum_fails_the_first_call(reward, monkeypatch):
    monkeypatch.setattr(reward, "MIN_PYTHON", (sys.version_info[0], sys.version_info[1] + 1))
    with pytest.raises(reward.MathVerifyUnavailable, match=r"needs Python >= 3\.\d+, as math_verify does"):
        reward.compute_score("s", make(), "1")


def test_under_python_3_9_the_first_call_fails_loudly():
    """Before, Python 3.9 scored every answer 0 without a word (a TypeError swallowed per answer)."""
    candidates = [shutil.which("python3.9"), *sorted(Path.home().glob(".pyenv/versions/3.9*/bin/python3.9"))]
    runs = [
        str(p)
        for p in candidates
        if p and subprocess.run([p, "-c", "0"], capture_output=True).returncode == 0
    ]
    if not runs:
        pytest.skip("no Python 3.9 on this machine (python3.9 on PATH or under ~/.pyenv)")
    python = runs[0]
    raised = _raised(_run_reward(FIRST_CALL, None, python))
    assert all(m is not None and "needs Python >= 3.10" in m for m in raised)


def test_warning_free_when_all_is_well(reward):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert score_all(reward, range(3)) == expected(range(3))


def test_a_zygote_that_exits_at_once_is_still_heard(tmp_path, monkeypatch):
    """The zygote may report that math_verify cannot import and exit before the first fork is asked."""
    module = load_reward()
    fake = tmp_path / "math_verify"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no math_verify here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    zygote = module._Zygote()
    try:
        zygote.proc.wait(timeout=60)  # gone before the caller says a word
        with pytest.raises(module._Unavailable, match="no math_verify here"):
            zygote.fork()
    finally:
        zygote.kill()
