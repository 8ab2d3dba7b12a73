"""shared-0012 on both verl bases: a checkpoint save killed at any point leaves a complete checkpoint to resume.

verl's own RayPPOTrainer._save_checkpoint and find_latest_ckpt_path from each base's sdist with the Qwen
recipe's series applied; ckpt_kill_points.py kills a forked save before each of its disk operations in
turn. The control is the same series without shared-0012, on the folder state a killed 0.6.0 save leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ascend_rl import manifest, overlay

SCRIPT = Path(__file__).with_name("ckpt_kill_points.py")


def _run(tree: Path, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tree", str(tree), "--mode", mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("base", ["0.6.0", "0.7.1", "0.9.1"])
def test_a_save_killed_anywhere_resumes_from_a_complete_checkpoint(base, pristine_base, tmp_path):
    recipe = manifest.load_recipe("qwen2_5", base)
    assert any(p.name.startswith("shared-0012") for p in recipe.series)
    patched = overlay.materialise(recipe, tmp_path / "patched", log=lambda m: None)

    rows = _run(patched, "kills")["kill_points"]
    killed = [r for r in rows if not r["completed"]]
    ops = {r["op"] for r in killed}
    # every kind of disk operation of a save was killed at: shards, mkdir, fsync, rename, tracker, rotation
    assert {"save", "makedirs", "fsync", "rename", "replace", "rmtree"} <= ops, ops
    assert rows[-1]["completed"] and rows[-1]["resumes_at"] == 2
    assert rows[-1]["folders"] == ["global_step_2", "latest_checkpointed_iteration.txt"]  # step 1 rotated out
    for row in killed:
        # never from scratch, never a partial folder (loadable_step loaded every shard), at most one step lost
        assert row["resumes_at"] in (1, 2), row
    # once the tracker is replaced, a kill (during the rotation) resumes from the new checkpoint
    after_tracker = killed[[r["op"] for r in killed].index("replace") + 1 :]
    assert after_tracker and all(r["resumes_at"] == 2 for r in after_tracker)


@pytest.mark.parametrize("base", ["0.6.0", "0.7.1", "0.9.1"])
def test_resume_skips_an_incomplete_checkpoint_in_one_line(base, pristine_base, tmp_path):
    recipe = manifest.load_recipe("qwen2_5", base)
    patched = overlay.materialise(recipe, tmp_path / "patched", log=lambda m: None)
    states = _run(patched, "legacy")
    assert states["only_data_pt"]["found"] is None
    assert states["only_data_pt"]["said"].endswith(
        "is incomplete (a save was interrupted): no complete checkpoint is left"
    )
    assert states["older_complete"]["found"] == "global_step_2"
    assert "global_step_3 is incomplete" in states["older_complete"]["said"]
    assert (
        states["empty_tracker"]["found"] == "global_step_2"
        and "is unreadable" in states["empty_tracker"]["said"]
    )

    # the control: without shared-0012 the tracker is trusted, and resume is sent to the folder that has
    # only data.pt (the 0.6.0 crash: FileNotFoundError on actor/model_world_size_1_rank_0.pt)
    without = replace(recipe, series=tuple(p for p in recipe.series if not p.name.startswith("shared-0012")))
    control = overlay.materialise(without, tmp_path / "control", log=lambda m: None)
    script = (
        "import os, sys, tempfile; import verl.utils.checkpoint.checkpoint_manager as cm\n"
        "root = tempfile.mkdtemp(); os.makedirs(os.path.join(root, 'global_step_1'))\n"
        "open(os.path.join(root, 'global_step_1', 'data.pt'), 'wb').close()\n"
        "open(os.path.join(root, 'latest_checkpointed_iteration.txt'), 'w').write('1')\n"
        "print(os.path.basename(cm.find_latest_ckpt_path(root)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(control), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "global_step_1"
