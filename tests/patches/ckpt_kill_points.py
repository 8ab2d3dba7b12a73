"""Run with a patched verl tree first on PYTHONPATH: kill a checkpoint save at every point it touches the disk.

verl's own RayPPOTrainer._save_checkpoint and find_latest_ckpt_path, on a stand-in trainer whose actor
worker group writes what a checkpoint manager writes (model and optimizer shards under actor/). A forked
child saves step 2 over a complete step-1 checkpoint (max_actor_ckpt_to_keep=1) and SIGKILLs itself before
its k-th disk operation (torch.save, mkdir, fsync, rename, replace, rmtree), for k = 1, 2, ... until a save
completes. After each kill, find_latest_ckpt_path must name a complete, loadable checkpoint. Prints one
JSON line: per kill point, the operation killed at and the step resume would load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import types
from contextlib import redirect_stdout

import torch
import verl.utils.checkpoint.checkpoint_manager as cm
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

SHARDS = ("model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt")


class ActorWorkers:
    """What the actor's checkpoint manager writes for one rank: its shards under local_path."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        for name in SHARDS:
            torch.save(
                {"step": global_step, "weights": torch.full((256,), float(global_step))},
                os.path.join(local_path, name),
            )


def trainer(root: str, step: int, keep: int):
    config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": root,
                "default_hdfs_dir": None,
                "max_actor_ckpt_to_keep": keep,
                "max_critic_ckpt_to_keep": keep,
            },
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
        }
    )
    loader = types.SimpleNamespace(state_dict=lambda: {"step": step})
    return types.SimpleNamespace(
        config=config,
        global_steps=step,
        actor_rollout_wg=ActorWorkers(),
        use_critic=False,
        train_dataloader=loader,
    )


def save(root: str, step: int, keep: int = 1) -> None:
    with redirect_stdout(io.StringIO()):
        RayPPOTrainer._save_checkpoint(trainer(root, step, keep))


def save_killed_at(root: str, step: int, k: int) -> tuple[bool, str]:
    """Fork; the child saves and SIGKILLs itself before its k-th disk operation. (completed, op killed at)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        count = [0]

        def wrap(owner, name):
            real = getattr(owner, name)

            def op(*args, **kwargs):
                count[0] += 1
                if count[0] == k:
                    os.write(write, name.encode())
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)

            setattr(owner, name, op)

        for owner, name in (
            (torch, "save"),
            (os, "makedirs"),
            (os, "fsync"),
            (os, "rename"),
            (os, "replace"),
            (shutil, "rmtree"),
        ):
            wrap(owner, name)
        save(root, step)
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        op = f.read()
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, op


def loadable_step(ckpt: str | None) -> int | None:
    """The step a resume from ckpt would get, after loading every file it reads (None: nothing to resume)."""
    if ckpt is None:
        return None
    step = int(ckpt.rsplit("global_step_", 1)[1])
    for name in SHARDS:
        state = torch.load(os.path.join(ckpt, "actor", name), weights_only=False)
        assert state["step"] == step and bool((state["weights"] == step).all()), (ckpt, name)
    assert torch.load(os.path.join(ckpt, "data.pt"), weights_only=False) == {"step": step}
    return step


def latest(root: str) -> tuple[str | None, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        found = cm.find_latest_ckpt_path(root)
    return found, out.getvalue()


def kill_points() -> dict:
    rows = []
    for k in range(1, 200):
        root = tempfile.mkdtemp()
        save(root, 1)
        completed, op = save_killed_at(root, 2, k)
        found, said = latest(root)
        rows.append(
            {
                "k": k,
                "op": op or None,
                "completed": completed,
                "resumes_at": loadable_step(found),
                "said_incomplete": "incomplete" in said,
                "folders": sorted(os.listdir(root)),
            }
        )
        # the rerun: saving step 2 again over what the kill left completes, and rotates step 1 out
        save(root, 2)
        assert loadable_step(latest(root)[0]) == 2 and sorted(os.listdir(root)) == [
            "global_step_2",
            "latest_checkpointed_iteration.txt",
        ], os.listdir(root)
        shutil.rmtree(root)
        if completed:
            break
    return {"kill_points": rows}


def legacy_states() -> dict:
    """Folders left by an unpatched save: the 0.6.0 crash state (tracker at a folder with only data.pt)."""
    out = {}
    root = tempfile.mkdtemp()
    os.makedirs(os.path.join(root, "global_step_1"))
    torch.save({"step": 1}, os.path.join(root, "global_step_1", "data.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")
    out["only_data_pt"] = latest(root)
    save(root, 2)  # this run saves, then the tracker points at a complete folder again
    os.makedirs(os.path.join(root, "global_step_3"))
    torch.save({"step": 3}, os.path.join(root, "global_step_3", "data.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("3")
    out["older_complete"] = latest(root)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("")  # truncated by a kill between truncate and write
    out["empty_tracker"] = latest(root)
    return {
        name: {"found": os.path.basename(found) if found else None, "said": said.strip()}
        for name, (found, said) in out.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True)
    parser.add_argument("--mode", choices=("kills", "legacy"), default="kills")
    args = parser.parse_args()
    assert os.path.realpath(cm.__file__).startswith(os.path.realpath(args.tree)), cm.__file__
    result = kill_points() if args.mode == "kills" else legacy_states()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
