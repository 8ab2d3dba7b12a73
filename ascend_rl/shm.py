"""The /dev/shm names a run created and left behind, and their removal by those names only.

verl 0.7.1's server-mode rollout never shuts its vLLM engine down: when the trainer ends, Ray force-kills the
vLLMHttpServer actor and SIGKILLs its children, the EngineCore process and multiprocessing's resource
tracker (the one process that would unlink what the others leaked). The engine's message queues then stay in
/dev/shm: the EngineCore's broadcast queue (psm_*, 160 MiB: vllm/v1/executor/multiproc_executor.py:139)
and its worker's response queue (psm_*, 240 MiB: multiproc_executor.py:490), both made at
shm_broadcast.py:197. The executor's lock (sem.mp-*, multiproc_executor.py:148) the EngineCore unlinks itself
soon after start-up in the runs seen here; a run killed before that, or inside a weight sync (verl's
verl_weights_* buckets), leaves those too.

The run's processes write every name they create to a record as they create it (the hook
ascend_rl/shm_record/recipes_shm_record.py, switched on by RECIPES_SHM_RECORD): the launchers record each real
launch and run `python3 -m ascend_rl shm clean` before the next one on the node (clean_node); the harness's
launch() records each run into <run folder>/shm.jsonl, calls remove_leftovers() on its run's record once the run
has ended, and clean_out() on every record in its output folder before it starts, which takes care of a run killed
with its harness. A name is removed
only when the record says this run created it and never unlinked it, it is still there, its creator has
ended, and no live process maps it or holds it open (/proc/*/maps, /proc/*/fd). Nothing is ever removed
by pattern.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV = "RECIPES_SHM_RECORD"  # the hook's setting: the file it appends to
RECORD = "shm.jsonl"  # that file, in the run's folder
SHM = Path("/dev/shm")


@dataclass
class Cleanup:
    """What one cleanup did: the names it removed, and those it left (name -> why)."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    def __iadd__(self, other: Cleanup) -> Cleanup:
        self.removed += other.removed
        self.kept.update(other.kept)
        return self


def read_record(path: Path) -> dict[str, dict]:
    """The names the record says were created and not unlinked since, each with its last create event (pid,
    start, size, by, cmd). A line cut short (its writer was killed mid-write) is skipped."""
    left: dict[str, dict] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return left
    for line in text.splitlines():
        try:
            event = json.loads(line)
            name, kind = event["name"], event["event"]
        except (ValueError, KeyError, TypeError):
            continue
        if kind == "create":
            left[name] = event
        else:  # unlinked by the run, or removed by an earlier cleanup
            left.pop(name, None)
    return left


def safe_name(name: object) -> bool:
    """A plain entry name of the shm folder: never a path, never . or .."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def start_time(pid: int) -> int | None:
    """pid's start time in clock ticks, None when there is no such process or it is a zombie (it has ended;
    its maps are gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == b"Z":
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def creator_alive(event: dict) -> bool:
    """The process that created the name is still running (the same pid and start time)."""
    pid = event.get("pid")
    if not isinstance(pid, int):
        return False
    now = start_time(pid)
    return now is not None and (event.get("start") is None or now == event["start"])


def in_use(shm_dir: Path = SHM) -> set[str]:
    """The names in shm_dir that some live process maps (/proc/<pid>/maps) or holds open (/proc/<pid>/fd)."""
    prefix = f"{shm_dir}/"
    needle = prefix.encode()
    found: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", "rb") as fh:
                data = fh.read()
        except OSError:
            data = b""
        if needle in data:
            for line in data.splitlines():
                at = line.find(needle)
                if at != -1:
                    found.add(line[at + len(needle) :].decode(errors="replace").removesuffix(" (deleted)"))
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith(prefix):
                    found.add(target[len(prefix) :].removesuffix(" (deleted)"))
    return found


def _mark_removed(record: Path, names: list[str]) -> None:
    """Append the removals to the record, so a later cleanup never looks at those names again."""
    with open(record, "a", encoding="utf-8") as fh:
        for name in names:
            fh.write(json.dumps({"event": "removed", "name": name, "pid": os.getpid()}) + "\n")


def remove_leftovers(record: Path, shm_dir: Path = SHM, settle_s: float = 0.0) -> Cleanup:
    """Unlink what the run of this record created in shm_dir and left there, once its creators have ended and no
    live process maps or holds it; waits up to settle_s for creators still ending (a killed group's processes)."""
    done = Cleanup()
    left = {
        name: event
        for name, event in read_record(record).items()
        if safe_name(name) and os.path.lexists(shm_dir / name)
    }
    if not left:
        return done
    deadline = time.monotonic() + settle_s
    while any(creator_alive(e) for e in left.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    busy = in_use(shm_dir)
    for name, event in sorted(left.items()):
        path = shm_dir / name
        if name in busy:
            done.kept[name] = "in use by a live process"
            continue
        if creator_alive(event):
            done.kept[name] = f"its creator (pid {event['pid']}) is still running"
            continue
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                done.kept[name] = "not a plain file"
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        done.removed.append(name)
    if done.removed:
        _mark_removed(record, done.removed)
    return done


def clean_out(out: Path, shm_dir: Path = SHM) -> Cleanup:
    """remove_leftovers() for every run folder's record under out (out/<run>/shm.jsonl)."""
    done = Cleanup()
    for record in sorted(out.glob(f"*/{RECORD}")) if out.is_dir() else ():
        done += remove_leftovers(record, shm_dir)
    return done


def describe(done: Cleanup, what: str) -> str | None:
    """One line on a cleanup (None when it found nothing to do)."""
    if not done.removed and not done.kept:
        return None
    parts = []
    if done.removed:
        parts.append(f"removed {len(done.removed)} /dev/shm entries {what} left ({', '.join(done.removed)})")
    if done.kept:
        why = "; ".join(f"{name}: {reason}" for name, reason in sorted(done.kept.items()))
        parts.append(f"kept {len(done.kept)} ({why})")
    return ", ".join(parts)


# --- the launchers' records: what a killed run left, removed at the next launch on the node ------------------------

LAUNCH_RECORDS = (
    "RECIPES_SHM_RECORDS"  # the folder of the launchers' records (default: the download cache's shm/)
)


def launch_records(folder: str | None = None) -> Path:
    """Where the launchers keep their records: $RECIPES_SHM_RECORDS, else <cache>/shm (~/.cache/ascend-rl-recipes)."""
    if folder or os.environ.get(LAUNCH_RECORDS):
        return Path(folder or os.environ[LAUNCH_RECORDS])
    cache = os.environ.get("RECIPES_CACHE") or str(Path.home() / ".cache" / "ascend-rl-recipes")
    return Path(cache) / "shm"


def clean_node(folder: Path, shm_dir: Path = SHM, host: str | None = None) -> tuple[Cleanup, int]:
    """remove_leftovers() for every record of this node (<folder>/<host>/*.jsonl); a record with nothing of it left
    in shm_dir and no creator still running is deleted. (Cleanup, bytes freed)."""
    import socket

    done, freed = Cleanup(), 0
    node = folder / (host or socket.gethostname())
    for record in sorted(node.glob("*.jsonl")) if node.is_dir() else ():
        sizes = {}
        for name in read_record(record):
            try:
                sizes[name] = (shm_dir / name).lstat().st_size if safe_name(name) else 0
            except OSError:
                sizes[name] = 0
        one = remove_leftovers(record, shm_dir)
        freed += sum(sizes.get(name, 0) for name in one.removed)
        done += one
        left = read_record(record)
        if not any(safe_name(n) and os.path.lexists(shm_dir / n) for n in left) and not any(
            creator_alive(e) for e in left.values()
        ):
            record.unlink(missing_ok=True)  # nothing of that run is left, and none of its creators still runs
    return done, freed


def _amount(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 1024:.0f} KiB"


def main(argv: list[str] | None = None) -> int:
    """`python3 -m ascend_rl shm clean [--records DIR]`: what the launchers run before a launch."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m ascend_rl shm", description=main.__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    clean = sub.add_parser(
        "clean", help="remove what earlier launches on this node left in /dev/shm, by name"
    )
    clean.add_argument(
        "--records", help=f"the records' folder (default: ${LAUNCH_RECORDS}, else <cache>/shm)"
    )
    args = parser.parse_args(argv)
    done, freed = clean_node(launch_records(args.records))
    if done.removed:
        print(
            f"shm: freed {_amount(freed)} of /dev/shm: {len(done.removed)} entries an earlier run of these "
            f"launchers left when it was killed ({', '.join(done.removed)})",
            flush=True,
        )
    if done.kept:
        print(f"shm: {describe(Cleanup(kept=done.kept), 'earlier runs')}", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
