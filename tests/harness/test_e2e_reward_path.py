"""The e2e reward-path check, fed the config lines verl's TaskRunner prints (no training)."""

from __future__ import annotations

from ascend_rl.harness import e2e

# as a verl 0.6.0 run prints them (pprint of the resolved config, under Ray's actor prefix)
LOG = """\
\x1b[36m(TaskRunner pid=19902)\x1b[0m  'custom_reward_function': {'name': 'compute_score',
\x1b[36m(TaskRunner pid=19902)\x1b[0m                             'path': '/r/new_math_reward.py'},
\x1b[36m(TaskRunner pid=19902)\x1b[0m                   'reward_manager': 'naive',
"""


def test_the_reward_path_is_read_from_the_printed_config(tmp_path):
    log = tmp_path / "launcher.log"
    assert e2e.reward_path(log) is None  # no log
    log.write_text("no config printed\n")
    assert e2e.reward_path(log) is None
    log.write_text(LOG)
    assert e2e.reward_path(log) == "naive/compute_score"
    batch = LOG.replace("'naive'", "'batch'").replace("'compute_score'", "'compute_score_batch'")
    log.write_text(batch)
    assert e2e.reward_path(log) == "batch/compute_score_batch"


def test_the_batched_run_asks_for_the_batch_manager_and_is_checked_for_it():
    args = e2e.parse_args(["--out", "/tmp/x"])
    overrides = e2e.run_overrides("resume", args)
    assert overrides[-2:] == [
        "reward_model.reward_manager=batch",
        "custom_reward_function.name=compute_score_batch",
    ]
    assert not any("reward_manager" in o for o in e2e.run_overrides("sync", args))
    run = {"reward_path": "batch/compute_score_batch", "reward_mean": [0.25]}
    assert e2e.check_reward_path("resume", run)["ok"]
    assert not e2e.check_reward_path("resume", {**run, "reward_path": "naive/compute_score_batch"})["ok"]
    assert not e2e.check_reward_path("resume", {**run, "reward_path": None})["ok"]
    assert not e2e.check_reward_path("resume", {**run, "reward_mean": [None]})["ok"]  # a step scored nothing
