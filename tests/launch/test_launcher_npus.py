"""NPUS on the two Qwen launchers (issue 36, item 6): a value that is no card count is refused by both in the same
one line, exit 2, before anything runs; the single-card launcher, which used to run NPUS=0 as one card, takes
NPUS unset or 1 only and says which launcher takes more cards."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher_env import launcher_env, run_launcher

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
QWEN4 = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b.sh"


def _dry_run(tmp_path: Path, script: Path, npus: str):
    # refused before the verl tree is looked at: none is needed
    return run_launcher(script, ["--dry-run"], launcher_env(tmp_path, tmp_path / "no-tree", NPUS=npus))


@pytest.mark.parametrize("npus", ["0", "00", "four", "-1"])
@pytest.mark.parametrize("script", [QWEN, QWEN4], ids=lambda p: p.name)
def test_npus_that_is_no_card_count_is_refused_the_same_way_by_both(tmp_path, script, npus):
    proc = _dry_run(tmp_path, script, npus)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"{script.name}: NPUS must be a card count (1, 4, ...), not '{npus}'\n"


def test_the_single_card_launcher_refuses_another_card_count(tmp_path):
    proc = _dry_run(tmp_path, QWEN, "4")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "run_qwen2_5_1_5b_single.sh: NPUS must be 1 on this one-card launcher, not '4'; "
        "for 4 cards run run_qwen2_5_1_5b.sh\n"
    )


def test_npus_1_on_the_single_card_launcher_is_one_card(tmp_path, verl_tree):
    proc = run_launcher(QWEN, ["--dry-run"], launcher_env(tmp_path, verl_tree, NPUS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "trainer.n_gpus_per_node = 1" in proc.stdout
