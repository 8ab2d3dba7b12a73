"""Say in one line why a training run ended with an error: what died, in which step and phase, and how.

    python3 -m ascend_rl run_failure LOG

LOG is the launcher's log of a main_ppo run (the launchers call this when main_ppo exits non-zero). It reads,
in this order: the line of the launcher's watch across nodes (`ray_cluster: error: ...`: a node lost while the
run went, a placement group that stayed pending; the watch ended the run, so its reason is the run's), Ray's
report of a dead actor (ActorDiedError: the actor's class, its rank, its pid, why its process ended; the node's
address when the actor died with its node), a full disk during a checkpoint save (the folder, and the space left
there), otherwise the last error line; the step is the one after the last `step:N` line verl printed, the phase
the trainer's frame in the traceback (generation, weight sync, reward, update, checkpoint save). Exit status 0
when it printed a line, 2 on a usage error or an unreadable log.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

# the trainer's (ray_trainer.py) and workers' frames that name the phase a step was in
PHASES = (
    ("_save_checkpoint", "saving its checkpoint"),
    ("save_checkpoint", "saving its checkpoint"),
    ("update_weights", "the weight sync"),
    ("generate_sequences", "generation"),
    ("compute_rm_score", "the reward"),
    ("reward", "the reward"),
    ("update_actor", "the update"),
    ("compute_log_prob", "the log-prob pass"),
    ("compute_ref_log_prob", "the reference pass"),
)
ROLES = {
    "WorkerDict": "trainer rank",
    "TaskRunner": "the trainer's driver (TaskRunner)",
    "vLLMHttpServer": "the vLLM server",
    "AsyncvLLMServer": "the vLLM server",
    "RewardLoopWorker": "a reward worker",
    "RewardManagerWorker": "a reward worker",
    "AgentLoopWorker": "an agent-loop worker",
}


def summarise(text: str) -> str:
    lines = text.splitlines()
    steps = [int(m.group(1)) for line in lines if (m := re.search(r"\bstep:(\d+) - ", line))]
    step = (max(steps) + 1) if steps else 1
    phase = None
    for line in lines:
        frame = re.search(r'File ".*/verl/.*", line \d+, in (\w+)', line)
        if frame:
            for name, what in PHASES:
                if name in frame.group(1):
                    phase = what
                    break
    where = f"in step {step}" + (f" ({phase})" if phase else "")
    watched = [m.group(1) for line in lines if (m := re.match(r"ray_cluster: error: (.*)", line.strip()))]
    if watched:  # the launcher's watch ended the run: what it saw is why
        lost = re.match(r"node (\S+)(?: \([^)]*\))? (?:left the Ray cluster|stopped answering)", watched[-1])
        if lost:
            return f"run: node {lost.group(1)} was lost {where}; ray_cluster watch: {watched[-1]}"
        return f"run: stopped {where} by ray_cluster watch: {watched[-1]}"
    died = text.rfind("ActorDiedError: The actor died")
    if died >= 0:
        block = text[died : died + 3000]
        cls = re.search(r"class_name: ([\w.<>]+)", block)
        cls_name = cls.group(1).rsplit(".", 1)[-1] if cls else "an actor"
        role = ROLES.get(cls_name, cls_name)
        rank = re.search(r"name: \w*?" + re.escape(cls_name) + r"_(\d+):(\d+)", block)
        pid = re.search(r"\bpid: (\d+)", block)
        who = role + (f" {rank.group(2)}" if rank and cls_name == "WorkerDict" else "")
        detail = ["the actor, rollout and reference worker"] if cls_name == "WorkerDict" else []
        detail += [f"pid {pid.group(1)}"] if pid else []
        who += f" ({', '.join(detail)})" if detail else ""
        how = "its process ended"
        node_died = re.search(r"The actor died because its node has died\.[^\n]*(?:\n\s*(.*))?", block)
        if node_died:
            ip = re.search(r"^\s*ip: (\S+)", block, re.M)
            node = ip.group(1) if ip else "its node"
            reason = (node_died.group(1) or "").strip().rstrip(".")
            return f"run: node {node} was lost {where}: {who} died with it" + (
                f" ({reason})" if reason else ""
            )
        if "Worker unexpectedly exits" in block or "SYSTEM_ERROR" in block:
            how = "its process was killed (SIGKILL, the OOM killer, or a crash)"
        elif "INTENDED_USER_EXIT" in block:
            how = "it was stopped"
        return f"run: {who} died {where}: {how}"
    full = re.search(
        r"No space left on device|file write failed|inline_container\.cc:\d+\]\s*\.\s*unexpected pos", text
    )
    if full:  # torch.save on a full disk says only "unexpected pos" or "file write failed"
        folders = re.findall(r"local_global_step_folder: (\S+)", text)
        folder = folders[-1] if folders else "the checkpoint folder"
        free = ""
        if folders:
            parent = Path(folder).parent
            try:
                free = f", {shutil.disk_usage(parent).free / 2**20:.1f} MiB free there now"
            except OSError:
                pass
        return f"run: failed {where}: the disk is full writing {folder}{free} ({full.group(0)})"
    error = None
    for line in lines:
        m = re.search(r"(\w+(Error|Exception)\b.*)", line)
        if m and "Error executing job" not in line:
            error = m.group(1).strip()
    return f"run: failed {where}: {error[:240] if error else 'no error line in the log'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the launcher's log of the run")
    args = parser.parse_args(argv)
    try:
        text = args.log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        print(f"run_failure: error: cannot read {args.log}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"{summarise(text)}; the log: {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
