"""ascend_rl/harness/launch.py reads what verl writes, not what its console says: the steps from verl's metrics
file (VERL_FILE_LOGGER_PATH), the resumed-from step from the checkpoint tracker as the run started and the first
step logged. A stand-in launcher (bash writing verl's files and misleading console lines) keeps it fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_rl.harness import launch

# launch() with a stand-in launcher: quick, but the harness asks every test that launches for its tier
pytestmark = pytest.mark.ci


def _stand_in(tmp_path: Path, steps: list[int], console: str = "") -> Path:
    """A launcher that logs `steps` to verl's metrics file, one console line after each, and prints `console`."""
    script = ["set -eu", f"printf '%s\\n' {json.dumps(console)}"]
    for step in steps:
        row = json.dumps(
            {"step": step, "data": {"critic/score/mean": step / 10, "training/stale_probs_diff_mean": 0}}
        )
        script += [f"echo '{row}' >> \"$VERL_FILE_LOGGER_PATH\"", "echo 'an INFO line'"]
    path = tmp_path / "launcher.sh"
    path.write_text("\n".join(script) + "\n")
    return path


def _seed_tracker(step: int):
    def seed(run_dir: Path) -> None:
        root = run_dir / "ckpt" / "e2e_resume"
        (root / f"global_step_{step}").mkdir(parents=True)
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))

    return seed


def _launch(tmp_path: Path, launcher: Path, name: str = "resume", seed=None) -> launch.RunResult:
    out = tmp_path / "out"
    return launch.launch(name, launcher, [], out, tmp_path / "m", tmp_path / "d", timeout_s=60, seed=seed)


def test_steps_come_from_the_metrics_file_and_are_shown_as_they_appear(tmp_path, capsys):
    # no console line says "step:": the file alone tells the steps
    result = _launch(tmp_path, _stand_in(tmp_path, [1, 2, 3]), name="sync")
    assert [row["step"] for row in result.rows] == [1, 2, 3]
    assert result.rows[2]["critic/score/mean"] == pytest.approx(0.3)
    shown = [line for line in capsys.readouterr().out.splitlines() if ": sync: step " in line]
    assert [line.split(": sync: ")[1].split(":")[0] for line in shown] == ["step 1", "step 2", "step 3"]
    assert result.resumed_from is None and result.checkpoint_at_start is None


def test_resume_is_the_trackers_step_when_verl_counts_on_from_it(tmp_path):
    # the console's claim is ignored; the tracker said 2 and verl's first step is 3
    launcher = _stand_in(tmp_path, [3], console="Found checkpoint: /x/global_step_7")
    result = _launch(tmp_path, launcher, seed=_seed_tracker(2))
    assert (result.resumed_from, result.checkpoint_at_start) == (2, 2)


def test_a_run_that_starts_over_despite_the_tracker_did_not_resume(tmp_path):
    launcher = _stand_in(tmp_path, [1, 2, 3], console="Found checkpoint: /x/global_step_2")
    result = _launch(tmp_path, launcher, seed=_seed_tracker(2))
    assert result.resumed_from is None and result.checkpoint_at_start == 2


def test_a_run_that_logs_no_step_fails_in_one_line(tmp_path):
    with pytest.raises(launch.HarnessError, match="logged no step to .*metrics.jsonl"):
        _launch(tmp_path, _stand_in(tmp_path, [], console="step:1 training/x:0"), name="sync")
