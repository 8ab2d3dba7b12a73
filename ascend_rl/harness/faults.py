"""Kill whole training runs on CPU inside a checkpoint save, rerun the launcher, and check what it resumes from.

Each kill runs a recipe launcher's CPU profile (as `make e2e` does) with a checkpoint every step and
trainer.max_actor_ckpt_to_keep=1 (the DeepSeek launcher's retention): the Qwen2.5 launcher (FSDP2, one
trainer rank) on each verl base (on 0.9.1, its default, the kills in the save and in the engine only), and the
DeepSeek launcher (the Megatron actor on 2 gloo ranks, EP=2, a tiny DeepSeek-V3; verl 0.6.0 and 0.7.1; on 0.9.1, its
default, its Megatron engine: the kill of the whole group in the save). make test kills each recipe's run on its
default base in the save (tests/harness/test_faults.py's CI_PLAN). The harness's sitecustomize hook pauses the
first torch.save under global_step_2 (FSDP: a trainer rank writing its actor shard; Megatron: rank 0 writing
the dist checkpoint's common.pt while rank 1 waits in the save's collective) and this script then kills,
for real, from outside:

    group@save  the run's whole process group (a node or job kill) while step 2 is being saved
    rank@save   only the trainer rank that is writing (a worker dying in the save)
    engine@step2  the vLLM engine's process once step 1 is logged (a dead engine mid-step): verl 0.7.1's
                vLLM server; on verl 0.6.0's sync rollout the engine runs inside trainer rank 0, so that rank
    diskfull@save the checkpoints on a tmpfs that holds step 1's save but not step 2's beside it (root only;
                Qwen: the size is that of its checkpoint)
    group@gen   the whole process group while a process of the run is in step 2's generate_sequences
    group@update  the whole process group while a trainer rank is in step 2's update_actor
    driver@step2  only main_ppo's driver actor (TaskRunner) once step 1 is logged
    reward@step2  every helper process of the reward (new_math_reward.py's math_verify zygote and workers)
                once step 1 is logged: the reward replaces them, so the run itself must go on to its last step

then reruns the launcher with trainer.resume_mode=auto on what the kill left. With --e2e-checks (make test's kills,
group@save on verl 0.9.1 only) the killed run and its rerun also carry make e2e's proof of the run (e2e.killed_run_proof:
steps 1 to 3 across the two, one actor forward per step, the weight sync at the last step, DeepSeek's reshard bytes
and reference), so make test needs no separate uninterrupted run of each recipe's default base. Pass: the rerun resumes from
the newest complete checkpoint (step 1: step 2's save never finished), never from scratch and never from a
partial folder, finishes the run's steps, and no process of the killed run is left (found by a variable only
this run's processes carry in their environment). A kill of one rank is also timed: how long the run takes
to end by itself (it is ended by force after --end-within seconds). Prints a table, writes <out>/faults.json.
Exit status: 0 every kill passed, 1 one did not, 2 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ascend_rl.data.util import write_json_atomic
from ascend_rl.harness import e2e
from ascend_rl.harness.launch import (
    DS_LAUNCHER,
    QWEN_LAUNCHER,
    HarnessError,
    check_interpreter,
    launch,
    out_lock,
)
from ascend_rl.paths import REPO

KINDS = (
    "group@save",
    "rank@save",
    "engine@step2",
    "diskfull@save",
    "group@gen",
    "group@update",
    "driver@step2",
    "reward@step2",
)
# the kills that wait for a moment in step 2 (step 1 logged), and what the process to kill is then called: a
# Ray actor's process title names the method it runs (ray::WorkerDict.actor_rollout_update_actor)
STEP2_TITLES = {
    "group@gen": ("generate_sequences",),
    "group@update": ("update_actor",),
    "driver@step2": ("ray::TaskRunner",),
    "reward@step2": ("--serve-math-verify-worker",),
}
DISK_KIB = 7 * 1024  # one checkpoint of the e2e model is about 4.6 MiB (model, optimizer, extra, data.pt)
# what a vLLM engine process is called: verl 0.7.1's server actor (Ray's process title) and vLLM's EngineCore;
# verl 0.6.0's sync rollout (the guide's mode, both recipes' CPU runs there) builds the engine inside each
# trainer rank (Ray's WorkerDict actor)
# verl 0.9.1's server actor is vLLMHttpServer too (vllm_async_server.py:87), its engine vLLM 0.23's EngineCore
ENGINE_TITLES = {
    "0.6.0": ("WorkerDict",),
    "0.7.1": ("vLLMHttpServer", "EngineCore"),
    "0.9.1": ("vLLMHttpServer", "EngineCore"),
}
BASES = ("0.6.0", "0.7.1", "0.9.1")
RECIPES = ("qwen2_5", "deepseek_r1")
# the bases and kills each recipe's CPU run supports: the disk-full size is the Qwen checkpoint's; on verl 0.9.1
# (in its own environment: launch.py's BASE_ENVS) the kills in the save and in the engine for Qwen, the kill in the
# save for DeepSeek (its Megatron engine's dist checkpoint)
SUPPORTED = {
    "qwen2_5": {"bases": BASES, "kills": KINDS, "kills_on": {"0.9.1": ("group@save", "engine@step2")}},
    "deepseek_r1": {
        "bases": BASES,
        "kills": tuple(k for k in KINDS if k != "diskfull@save"),
        "kills_on": {"0.9.1": ("group@save",)},
    },
}
# the kill whose runs carry e2e's proof with --e2e-checks (e2e.killed_run_proof): the default base's runs (e2e.KILLED_RUNS)
# killed whole in the step-2 save, so the killed run logged step 1 and the rerun resumes from it
E2E_CHECKED = ("0.9.1", "group@save")
PAUSE_AT = "global_step_2"  # the first torch.save under it is the actor shard of the step-2 save
STEPS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Run it with the e2e environment's Python: .venv-e2e/bin/python -m ascend_rl faults",
    )
    parser.add_argument("--out", type=Path, default=REPO / "e2e_out" / "faults", help="output folder")
    parser.add_argument(
        "--recipes", default=",".join(RECIPES), help="comma-separated recipes (default: %(default)s)"
    )
    parser.add_argument(
        "--bases", default=",".join(BASES), help="comma-separated verl bases (default: %(default)s)"
    )
    parser.add_argument(
        "--kills", default=",".join(KINDS), help="comma-separated kill kinds (default: %(default)s)"
    )
    parser.add_argument(
        "--end-within", type=float, default=120.0, help="seconds a run with a dead rank may take to end"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run each base once uninterrupted and compare the rerun's step-2 metrics with it",
    )
    parser.add_argument(
        "--e2e-checks",
        action="store_true",
        help="a kill in the step-2 save on verl 0.9.1 (group@save) also carries make e2e's proof of the run: "
        "steps, one actor forward per step, weight sync, reshard bytes (DeepSeek), over the killed run's step 1 "
        "and the rerun's steps 2 and 3 (make test's kills)",
    )
    parser.add_argument(
        "--timeout", type=int, default=900, help="seconds one run may take (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    args.bases = [b.strip() for b in args.bases.split(",") if b.strip()]
    args.kills = [k.strip() for k in args.kills.split(",") if k.strip()]
    if not args.recipes or set(args.recipes) - set(RECIPES):
        parser.error(f"--recipes takes {', '.join(RECIPES)}; got {args.recipes}")
    if not args.bases or set(args.bases) - set(BASES):
        parser.error(f"--bases takes {', '.join(BASES)}; got {args.bases}")
    if not args.kills or set(args.kills) - set(KINDS):
        parser.error(f"--kills takes {', '.join(KINDS)}; got {args.kills}")
    args.plan, args.not_run = plan(args.recipes, args.bases, args.kills)
    if not args.plan:
        parser.error("nothing to run: " + "; ".join(args.not_run))
    other = sorted({f"{kind} on {base}" for _, base, kind in args.plan if (base, kind) != E2E_CHECKED})
    if args.e2e_checks and other:
        parser.error(
            f"--e2e-checks is for {E2E_CHECKED[1]} on verl {E2E_CHECKED[0]} only; the plan has {', '.join(other)}"
        )
    return args


def plan(
    recipes: list[str], bases: list[str], kills: list[str]
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The (recipe, base, kill) runs asked for that the recipes' CPU runs support, and a line per one left out."""
    runs, left = [], []
    for recipe in recipes:
        can = SUPPORTED[recipe]
        for base in bases:
            if base not in can["bases"]:
                left.append(f"{recipe} has no CPU run on verl {base}")
                continue
            tried = can.get("kills_on", {}).get(base, can["kills"])
            runs += [(recipe, base, kind) for kind in kills if kind in tried]
            left += [f"{kind} is not tried on {recipe} (verl {base})" for kind in kills if kind not in tried]
    return runs, sorted(set(left))


def e2e_run(recipe: str, base: str) -> str:
    """The recipe's e2e run on `base` (Qwen: its sync run on 0.6.0, its v071 and v091 runs on 0.7.1 and 0.9.1;
    DeepSeek: its deepseek, deepseek-v071 or deepseek-v091 run)."""
    runs = e2e.DEEPSEEK_RUNS if recipe == "deepseek_r1" else ("sync", "v071", "v091")
    return next(run for run in runs if e2e.RUN_BASE[run] == base)


def overrides(recipe: str, base: str, run_dir: Path | None = None) -> list[str]:
    """e2e's short run of the recipe (e2e_run), saving every step, keeping one; DeepSeek's reshard report into
    run_dir (left out without one)."""
    ns = argparse.Namespace(steps=STEPS, lr=2e-3, prompts=4, out=REPO / "e2e_out")
    mine = {
        "trainer.save_freq": "1",
        "trainer.max_actor_ckpt_to_keep": "1",
        "trainer.resume_mode": "auto",
    }
    kept = []
    for o in e2e.run_overrides(e2e_run(recipe, base), ns):
        key = o.split("=")[0]
        if key in mine:
            continue
        if "RECIPE_RESHARD_REPORT" in key:  # e2e's path is its own run folder's
            if run_dir is None:
                continue
            o = f"{key}={run_dir / 'reshard.jsonl'}"
        kept.append(o)
    return kept + [f"{k}={v}" for k, v in mine.items()]


def run_name(recipe: str, kind: str, base: str) -> str:
    """A run's folder under --out (and, prefixed faults_, its RUN_NAME): a kill's, or the baseline's."""
    return ("ds-" if recipe == "deepseek_r1" else "") + f"{kind.replace('@', '-')}-{base}"


def run_processes(tag: str) -> list[int]:
    """Live processes whose environment carries tag (only this run's processes do)."""
    found, needle = [], tag.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str | None:
    """pid's command line (Ray's actors: their process title), or None once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def _is_reward_helper(pid: int) -> bool:
    return STEP2_TITLES["reward@step2"][0] in (cmdline(pid) or "")


def recipe_run(recipe: str, name: str, base: str, args, model_dir: Path, data_dir: Path, **kwargs):
    """One run of the recipe launcher's CPU profile with this script's overrides (launch() does the rest)."""
    return launch(
        name,
        DS_LAUNCHER if recipe == "deepseek_r1" else QWEN_LAUNCHER,
        overrides(recipe, base, args.out / name),
        args.out,
        model_dir,
        data_dir,
        timeout_s=args.timeout,
        prefix="faults",
        base=base,
        **kwargs,
    )


def ckpt_root(out: Path, name: str) -> Path:
    """Where the launcher saves a run's checkpoints (CKPT_DIR/RUN_NAME, as launch() sets them)."""
    return out / name / "ckpt" / f"faults_{name}"


COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "training/rollout_probs_diff_mean")


def compare(rerun: list[dict], baseline: list[dict], step: int = 2) -> dict:
    """The rerun's metrics at `step` against the uninterrupted run's: the largest absolute difference."""
    mine = next((r for r in rerun if r["step"] == step), {})
    theirs = next((r for r in baseline if r["step"] == step), {})
    diffs = {k: abs(mine[k] - theirs[k]) for k in COMPARED if k in mine and k in theirs}
    return {"max_abs_diff": max(diffs.values()) if diffs else None, "diffs": diffs}


def children(pid: int) -> list[str]:
    """The command lines of pid's child processes."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((cmdline(int(entry.name)) or "")[:100])
        except (OSError, ValueError, IndexError):
            continue
    return found


def leftovers(tag: str, settle_s: float = 15.0) -> tuple[int, list[str]]:
    """The run's processes still alive settle_s after it ended (Ray's helpers outside the launcher's process
    group notice their raylet's death and exit on their own within a few seconds), with their commands."""
    deadline = time.monotonic() + settle_s
    while (pids := run_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = [name[:120] for name in map(cmdline, pids) if name is not None]
    return len(names), names


def kill_run(
    recipe: str, kind: str, base: str, args, model_dir: Path, data_dir: Path, baseline: list[dict] | None
) -> dict:
    name = run_name(recipe, kind, base)
    marker = args.out / name / "paused"
    tag = f"{args.out}/{name}/paused"  # RECIPES_FAULT_MARKER's value: in every process of this run only
    state: dict = {}

    def target() -> tuple[int, str] | None:
        """The process to kill and where it is, once the kill point is reached."""
        if kind.endswith("@save"):
            hits = list(marker.parent.glob(marker.name + ".*")) if marker.parent.is_dir() else []
            if not hits:
                return None
            pid, path = hits[0].read_text().split(" ", 1)
            return int(pid), Path(path.strip()).relative_to(ckpt_root(args.out, name)).as_posix()
        # the rest: once step 1 is logged (its checkpoint is saved before that), a process in step 2
        metrics = args.out / name / "metrics.jsonl"
        if not (metrics.is_file() and metrics.read_text(encoding="utf-8").strip()):
            return None
        titles = ENGINE_TITLES[base] if kind == "engine@step2" else STEP2_TITLES[kind]
        for pid in sorted(run_processes(tag)):  # the lowest pid: the first rank started
            title = cmdline(pid)
            if title is not None and any(t in title for t in titles):
                what = "reward helper" if kind == "reward@step2" else title.split()[0][:56]
                return pid, f"step 2: {what}"
        return None

    def watch() -> None:
        while not state.get("done"):
            found = target()
            if found is None:
                time.sleep(0.2)
                continue
            pid, where = found
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:  # it ended between the look and now: look again
                continue
            state.update(paused_in=where, pid=pid, children=children(pid), killed_at=time.monotonic())
            if kind.startswith("group@"):
                os.killpg(pgid, signal.SIGKILL)
                return
            if kind == "reward@step2":  # the zygote and every worker it forked: the reward must replace them
                helpers = [p for p in run_processes(tag) if _is_reward_helper(p)]
                for helper in helpers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(helper, signal.SIGKILL)
                state["helpers_killed"] = len(helpers)
                return
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + args.end_within
            while not state.get("done") and time.monotonic() < deadline:
                time.sleep(0.5)
            if not state.get("done"):
                state["forced"] = True
                os.killpg(pgid, signal.SIGKILL)
            return

    # the tag alone marks the run's processes; with the pause setting the hook also stops the step-2 save
    hook_env = {"RECIPES_FAULT_MARKER": tag}
    if kind.endswith("@save"):
        hook_env["RECIPES_FAULT_PAUSE_SAVE"] = PAUSE_AT
    # a marker left by an earlier run in this folder would name a process long gone (launch() clears the folder,
    # but only once it starts, after the watcher)
    for stale in marker.parent.glob(marker.name + ".*") if marker.parent.is_dir() else ():
        stale.unlink()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    row = {"recipe": recipe, "kind": kind, "base": base}
    try:
        result = recipe_run(recipe, name, base, args, model_dir, data_dir, hook_env=hook_env)
        row["killed_run"] = "finished (the kill point was never reached)"
        measured(row, "killed", result)
    except HarnessError as err:
        result = None
        row["killed_run"] = str(err).split(":", 1)[0]
        measured(row, "killed", err.measured)
    state["done"] = True
    ended = time.monotonic()
    watcher.join(5)
    if "killed_at" not in state:
        return {**row, "ok": False, "why": "the run never reached the kill point"}
    row["paused_in"] = state["paused_in"]
    # what the killed process had forked: a child holding its connection to Ray hides its death (ds-0011)
    row["children_at_kill"] = state.get("children", [])
    if kind == "reward@step2":  # the run must survive its reward's helpers: no rerun
        row["killed_run"] = "finished" if result is not None else row["killed_run"]
        row["helpers_killed"] = state.get("helpers_killed", 0)
        row["left"], row["left_names"] = leftovers(tag)
        steps = [r["step"] for r in result.rows] if result is not None else []
        row.update(rerun_steps=steps, steps_lost=0 if steps == list(range(1, STEPS + 1)) else None)
        row["ok"] = steps == list(range(1, STEPS + 1)) and row["helpers_killed"] > 0 and row["left"] == 0
        if not row["ok"]:
            row["why"] = (
                "the run did not finish its steps after its reward helpers were killed, or left processes"
            )
        return row
    row["ended_s"] = round(ended - state["killed_at"], 1)
    row["ended_by_itself"] = not state.get("forced", False)
    row["left"], row["left_names"] = leftovers(tag)
    row = after_failure(row, name, tag, args, model_dir, data_dir, baseline)
    if getattr(args, "e2e_checks", False) and "rerun_steps" in row:
        return with_e2e_proof(row, name, args)
    return row


def with_e2e_proof(row: dict, name: str, args) -> dict:
    """The row with make e2e's proof over the killed run and its rerun (--e2e-checks), its checks in the verdict."""
    try:
        proof = e2e.killed_run_proof(
            e2e_run(row["recipe"], row["base"]), args.out / name, args.out / f"{name}-rerun", STEPS
        )
    except HarnessError as err:
        return {**row, "ok": False, "why": f"e2e's proof: {err}"}
    failed = [f"{c['check']} ({c['detail']})" for c in proof["checks"] if not c["ok"]]
    row = {**row, "e2e": proof, "ok": row["ok"] and not failed}
    if failed:
        row["why"] = "; ".join(filter(None, [row.get("why"), "e2e's checks failed: " + "; ".join(failed)]))
    return row


def after_failure(row, name, tag, args, model_dir, data_dir, baseline) -> dict:
    """What a failed run left (its one line, processes, checkpoint folders), then the rerun and its checks."""
    row["left"], row["left_names"] = leftovers(tag)
    said = [
        line
        for line in (args.out / name / "launcher.log").read_text(errors="replace").splitlines()
        if line.startswith("run: ")
    ]
    row["said"] = said[-1] if said else None  # the launcher's one line on a failed run (run_failure.py)
    ckpt = ckpt_root(args.out, name)
    row["folders"] = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    # the step the rerun must resume from: the newest checkpoint the killed run completed (shared-0012's
    # marker); 1 for a kill inside step 2's save, 2 when a kill in step 2 landed after that step's save
    row["newest_complete"] = newest_complete(ckpt)

    rerun = f"{name}-rerun"

    def seed(run_dir: Path) -> None:
        shutil.copytree(ckpt, run_dir / "ckpt" / f"faults_{rerun}")

    try:
        result = recipe_run(row["recipe"], rerun, row["base"], args, model_dir, data_dir, seed=seed)
    except HarnessError as err:
        measured(row, "rerun", err.measured)
        return {**row, "ok": False, "why": f"the rerun failed: {err}"}
    measured(row, "rerun", result)
    steps = [r["step"] for r in result.rows]
    row.update(resumed_from=steps[0] - 1 if steps else None, rerun_steps=steps, rerun_s=round(result.wall_s))
    row["steps_lost"] = 2 - row["resumed_from"] if row["resumed_from"] is not None else None
    if baseline is not None:
        row["vs_uninterrupted"] = compare(result.rows, baseline)
    want = row["newest_complete"]
    row["ok"] = (
        want is not None
        and row["resumed_from"] == want
        and steps == list(range(want + 1, STEPS + 1))
        and row["left"] == 0
    )
    if not row["ok"]:
        row["why"] = (
            f"resumed from {row['resumed_from']}, not the newest complete checkpoint ({want}), did not finish, "
            "or left processes behind"
        )
    return row


def measured(row: dict, which: str, run) -> None:
    """A run's wall time and peak memory (PSS and summed RSS) into row, as <which>_wall_s and so on; run is a
    RunResult or a runner.Measured (a failed launch's), None when the launch never started."""
    if run is None:
        return
    row[f"{which}_wall_s"] = round(run.wall_s, 1)
    row[f"{which}_peak_pss_gib"] = round(run.peak_pss_gib, 2)
    row[f"{which}_peak_rss_gib"] = round(run.peak_rss_gib, 2)


def newest_complete(ckpt: Path) -> int | None:
    """The highest N of ckpt/global_step_N that carries shared-0012's checkpoint_complete marker."""
    steps = [
        int(p.name.removeprefix("global_step_"))
        for p in ckpt.glob("global_step_*")
        if p.name.removeprefix("global_step_").isdigit() and (p / "checkpoint_complete").is_file()
    ]
    return max(steps, default=None)


def disk_full_run(base: str, args, model_dir: Path, data_dir: Path, baseline: list[dict] | None) -> dict:
    """The checkpoints on a tmpfs of DISK_KIB: step 1's save fits, step 2's (kept beside it) does not."""
    name = run_name("qwen2_5", "diskfull@save", base)
    tag = f"{args.out}/{name}/paused"
    row = {
        "recipe": "qwen2_5",
        "kind": "diskfull@save",
        "base": base,
        "paused_in": f"tmpfs of {DISK_KIB} KiB",
    }

    def seed(run_dir: Path) -> None:
        (run_dir / "ckpt").mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", f"size={DISK_KIB}k", "tmpfs", str(run_dir / "ckpt")]
        done = subprocess.run(mount, capture_output=True, text=True)
        if done.returncode != 0:
            raise HarnessError(f"cannot mount a small tmpfs for the disk-full run: {done.stderr.strip()}")
        row["mounted"] = True

    try:
        try:
            recipe_run(
                "qwen2_5",
                name,
                base,
                args,
                model_dir,
                data_dir,
                seed=seed,
                hook_env={"RECIPES_FAULT_MARKER": tag},
            )
            return {**row, "ok": False, "why": "the run finished: the disk never filled"}
        except HarnessError as err:
            if not row.get("mounted"):
                return {**row, "ok": False, "why": str(err)}
            row["killed_run"] = str(err).split(":", 1)[0]
            measured(row, "killed", err.measured)
        row["ended_by_itself"] = True
        return after_failure(row, name, tag, args, model_dir, data_dir, baseline)
    finally:
        if row.get("mounted"):  # the rerun has copied what the run left
            subprocess.run(["umount", "-l", str(args.out / name / "ckpt")], check=False, capture_output=True)


def table(rows: list[dict]) -> str:
    head = f"{'recipe':<11} {'kill':<13} {'base':<6} {'paused in':<58} {'ended':>7} {'left':>4} {'resumed':>7} {'lost':>4}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        ended = f"{r['ended_s']}s" if "ended_s" in r else "-"
        ended += "" if r.get("ended_by_itself", True) else "*"
        lines.append(
            f"{r['recipe']:<11} {r['kind']:<13} {r['base']:<6} {r.get('paused_in', '-'):<58} {ended:>7} {r.get('left', '-'):>4} "
            f"{str(r.get('resumed_from', '-')):>7} {str(r.get('steps_lost', '-')):>4}  "
            + ("pass" if r["ok"] else f"FAIL: {r.get('why', '')}")
        )
        for c in r.get("e2e", {}).get("checks", []):
            lines.append(f"{'':<31}e2e: {'ok  ' if c['ok'] else 'FAIL'} {c['check']:<13} {c['detail']}")
        if r.get("vs_uninterrupted", {}).get("max_abs_diff") is not None:
            lines.append(
                f"{'':<31}step 2 against the uninterrupted run: largest difference "
                f"{r['vs_uninterrupted']['max_abs_diff']:.3g} over {', '.join(COMPARED)}"
            )
    lines.append("ended: seconds from the kill to the end of the killed run (* = it did not end by itself)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for line in args.not_run:
        print(f"faults: not run: {line}")
    try:
        check_interpreter()
        with out_lock(args.out, "faults"):
            inputs = {}
            if any(recipe == "qwen2_5" for recipe, _, _ in args.plan):
                inputs["qwen2_5"] = e2e.prepare_inputs(args.out, warm_start_steps=300)
            for base in sorted({base for recipe, base, _ in args.plan if recipe == "deepseek_r1"}):
                inputs[("deepseek_r1", base)] = e2e.prepare_deepseek_inputs(args.out, base=base)
            rows, baselines = [], {}
            for recipe, base, kind in args.plan:
                model_dir, data_dir = inputs[(recipe, base) if recipe == "deepseek_r1" else recipe]
                if args.baseline and (recipe, base) not in baselines:
                    name = run_name(recipe, "baseline", base)
                    baselines[recipe, base] = recipe_run(recipe, name, base, args, model_dir, data_dir).rows
                baseline = baselines.get((recipe, base))
                if kind == "diskfull@save":
                    rows.append(disk_full_run(base, args, model_dir, data_dir, baseline))
                else:
                    rows.append(kill_run(recipe, kind, base, args, model_dir, data_dir, baseline))
                print(f"faults: {rows[-1]}", flush=True)
            write_json_atomic(args.out / "faults.json", {"rows": rows})
    except HarnessError as err:
        print(f"faults: error: {err}", file=sys.stderr)
        return 1
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
