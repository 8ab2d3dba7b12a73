"""Patch shared-0004: the reward function's extra components become per-step training metrics."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from ascend_rl import overlay

METRIC_UTILS = "verl/trainer/ppo/metric_utils.py"
RAY_TRAINER = "verl/trainer/ppo/ray_trainer.py"


def _load_function(path: Path, name: str):
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"np": np, "Any": object}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def test_unpatched_fit_does_not_log_reward_components(pristine_verl: Path) -> None:
    assert "compute_reward_extra_metrics" not in (pristine_verl / RAY_TRAINER).read_text()


def test_patched_metrics_are_batch_means_of_numeric_components(verl_tree: Path) -> None:
    overlay.apply_series(overlay.load_recipe("qwen2_5", "0.6.0"), verl_tree)
    compute = _load_function(verl_tree / METRIC_UTILS, "compute_reward_extra_metrics")
    infos = {
        "score": [1.0, 0.0, 0.9, 0.2],
        "acc": [True, False, True, False],
        "format": [0.2, 0.1, 0.2, 0.05],
        "pred": ["1/4", "x", "2", None],
        "empty": [],
    }
    metrics = compute(infos)
    assert metrics == {
        "reward_extra/score/mean": np.mean([1.0, 0.0, 0.9, 0.2]),
        "reward_extra/acc/mean": 0.5,
        "reward_extra/format/mean": np.mean([0.2, 0.1, 0.2, 0.05]),
    }
    assert all(isinstance(v, float) for v in metrics.values())


def test_fit_adds_them_where_the_components_enter_the_batch(verl_tree: Path) -> None:
    overlay.apply_series(overlay.load_recipe("qwen2_5", "0.6.0"), verl_tree)
    lines = (verl_tree / RAY_TRAINER).read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "metrics.update(compute_reward_extra_metrics(" in ln)
    assert "batch.non_tensor_batch.update" in lines[at - 1] and "if reward_extra_infos_dict:" in lines[at - 2]
    tree = ast.parse("\n".join(lines))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "compute_reward_extra_metrics" in imported
