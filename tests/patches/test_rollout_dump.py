"""shared-0011 on verl 0.7.1: the rollout dump (trainer.rollout_data_dir) writes the reward's numpy extras.

verl's own RayPPOTrainer._dump_generations, imported from the 0.7.1 sdist with the Qwen recipe's 0.7.1
series applied (and, as the control, without shared-0011), called with extras as verl 0.7.1's reward loop
hands them over: numpy arrays of bools, float32 and ints (new_math_reward.py's correct, accuracy, ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ascend_rl import manifest, overlay

SCRIPT = r"""
import json, os, sys, tempfile, types
import numpy as np
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
out = tempfile.mkdtemp()
extras = {"correct": np.array([True, False]), "accuracy": np.array([0.7, 0.0], dtype=np.float32),
          "steps": np.array([3, 0]), "short": np.array([1.0])}  # a list of another length is left out
RayPPOTrainer._dump_generations(types.SimpleNamespace(global_steps=2), ["p1", "p2"], ["o1", "o2"],
                                ["4", "5"], [1.0, 0.0], extras, out)
print(open(os.path.join(out, "2.jsonl")).read())
"""


def _dump(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_dump_writes_numpy_extras_as_json_values(pristine_base, tmp_path):
    recipe = manifest.load_recipe("qwen2_5", "0.7.1")
    assert any(p.name.startswith("shared-0011") for p in recipe.series)
    patched = overlay.materialise(recipe, tmp_path / "patched", log=lambda m: None)
    proc = _dump(patched)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["correct"] for r in rows] == [True, False] and [r["steps"] for r in rows] == [3, 0]
    assert abs(rows[0]["accuracy"] - 0.7) < 1e-6 and "short" not in rows[0]

    # the control: the same series without shared-0011 dies as the 0.7.1 demo did
    without = replace(recipe, series=tuple(p for p in recipe.series if not p.name.startswith("shared-0011")))
    control = overlay.materialise(without, tmp_path / "control", log=lambda m: None)
    proc = _dump(control)
    assert proc.returncode != 0 and "is not JSON serializable" in proc.stderr
