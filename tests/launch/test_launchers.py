"""The launch scripts, run as a user runs them, against verl 0.6.0's own Hydra config.

Each test points VERL_DIR at a fresh copy of the pinned source distribution; the launcher's
preflight applies the recipe's patch series to it and composes the full override list.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from ascend_rl import ray_cluster
from launcher_env import LAUNCHERS, dry_run_plan, exported_names, launcher_env, run_launcher, write_rows

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5"
DEEPSEEK = REPO / "llm_rl" / "deepseek_r1"


_env, _run = launcher_env, run_launcher


def _command(proc) -> str:
    """The trainer's command line, from the dry run's JSON plan."""
    return shlex.join(dry_run_plan(proc)["argv"])


@pytest.mark.parametrize("script,cards", [(LAUNCHERS[0], "1"), (LAUNCHERS[1], "4")])
def test_qwen_dry_run_composes_and_prints_command(tmp_path, verl_tree, script, cards):
    proc = _run(script, ["--dry-run", "--json", "trainer.total_epochs=1"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr  # with --json the report goes to stderr
    assert "config     ok" in report
    assert f"trainer.n_gpus_per_node = {cards}" in report
    command = _command(proc)
    assert f"{Path(sys.executable).parent}/python3 -m verl.trainer.main_ppo" in command  # python3 on PATH
    assert command.endswith("trainer.total_epochs=1")  # the extra override comes last, so it wins
    assert "trainer.total_epochs = 1" in report
    assert "actor_rollout_ref.rollout.n=8" in command and "algorithm.adv_estimator=grpo" in command
    assert not (tmp_path / "run_log").exists()  # a dry run launches nothing


@pytest.mark.parametrize("variant,ep", [("real", "EP128"), ("random", "EP256")])
def test_deepseek_dry_run_composes_megatron_config_and_prints_nodes(tmp_path, verl_tree, variant, ep):
    proc = _run(
        LAUNCHERS[2],
        ["--variant", variant, "--dry-run", "--json", "trainer.total_epochs=2"],
        _env(tmp_path, verl_tree),
    )
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr  # with --json the report and the node-by-node commands go to stderr
    assert "(ppo_megatron_trainer)" in report
    assert f"256 devices, rollout {256 // int(ep[2:])} vLLM engine" in report
    assert f"of TP2 x DP{int(ep[2:]) // 2} = {ep}" in report
    assert "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = 8" in report
    command = _command(proc)
    assert "--config-name ppo_megatron_trainer" in command
    assert "+actor_rollout_ref.actor.megatron.override_transformer_config.swap_optimizer=True" in command
    assert "actor_rollout_ref.actor.recompute_old_log_prob=False" in command
    nodes = [line for line in report.splitlines() if line.startswith("node ")]
    assert len(nodes) == 17  # 16 ray starts, then the job on the head
    assert "--head --nodes 16" in nodes[0] and all("--worker" in n for n in nodes[1:16])
    assert f"--variant {variant} --base 0.6.0 trainer.total_epochs=2" in nodes[16]


def test_json_plan_resolves_last_one_wins_and_agrees_with_the_printed_command(tmp_path, verl_tree):
    # the recipe sets total_epochs=5 and rollout.n=8; a new key is added, changed, then deleted
    extra = ["trainer.total_epochs=1", "actor_rollout_ref.rollout.n=3", "trainer.total_epochs=2"]
    extra += ["+trainer.probe=a", "trainer.probe=b", "~trainer.probe"]
    env = _env(tmp_path, verl_tree)
    printed = _run(LAUNCHERS[0], ["--dry-run", *extra], env)
    assert printed.returncode == 0, printed.stderr
    plan = dry_run_plan(_run(LAUNCHERS[0], ["--dry-run", "--json", *extra], env))
    # the same command: the printed one is the plan's argv, each key's last override, behind the tree on PYTHONPATH
    lines = printed.stdout.splitlines()
    tree = plan["verl"]["tree"]
    start = next(i for i, line in enumerate(lines) if line.startswith("command ("))
    assert lines[start + 1] == (
        f"  PYTHONPATH={shlex.quote(tree)}${{PYTHONPATH:+:$PYTHONPATH}} {shlex.join(plan['argv'][:3])} \\"
    )
    assert plan["argv"][3:] == plan["override_args"] and plan["override_args"][-len(extra) :] == extra
    # last one wins, as Hydra composed it (the report's key settings), keys in the order they first appear
    final = plan["overrides"]
    assert final["trainer.total_epochs"] == "2" and "trainer.total_epochs = 2" in printed.stdout
    assert final["actor_rollout_ref.rollout.n"] == "3" and "actor_rollout_ref.rollout.n = 3" in printed.stdout
    assert final["trainer.probe"] is None  # deleted by the last override
    keys = list(final)
    assert keys[0] == "algorithm.adv_estimator" and keys[-1] == "trainer.probe"
    assert keys.index("trainer.total_epochs") < keys.index("trainer.save_freq")  # the recipe's place
    assert len(keys) == len(plan["override_args"]) - 5  # repeats: epochs twice, rollout.n once, probe twice
    # the verl tree, its base and what the launcher exports for the trainer, PYTHONPATH as it will be
    assert plan["verl"]["version"] == "0.6.0" and plan["verl"]["base"]["tag"] == "v0.6.0"
    assert plan["config_name"] == "ppo_trainer" and plan["verl"]["overlay"] is None
    assert exported_names(QWEN / "run_qwen2_5_1_5b.sh") <= set(plan["env"])
    assert plan["env"]["VLLM_USE_V1"] == "1" and plan["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "0"
    inherited = os.environ.get("PYTHONPATH")
    assert plan["env"]["PYTHONPATH"] == (f"{verl_tree}:{inherited}" if inherited else str(verl_tree))
    assert not (tmp_path / "run_log").exists()  # a dry run launches nothing


def test_deepseek_plan_names_what_the_launcher_and_env_sh_export(tmp_path, verl_tree):
    plan = dry_run_plan(_run(LAUNCHERS[2], ["--dry-run", "--json"], _env(tmp_path, verl_tree)))
    assert exported_names(LAUNCHERS[2], DEEPSEEK / "env.sh") <= set(plan["env"])
    # the reshard planner travels in the verl tree (ds-0006 installs it): nothing points the workers at this repository
    assert not any("RECIPE_MOE_RESHARD_DIR" in x for x in [*plan["env"], *plan["override_args"]])
    assert plan["config_name"] == "ppo_megatron_trainer" and plan["cwd"] == str(DEEPSEEK)
    assert plan["argv"][3:5] == ["--config-name", "ppo_megatron_trainer"]


@pytest.mark.parametrize("script", LAUNCHERS, ids=lambda p: p.name)
def test_misspelt_override_is_rejected_with_the_nearest_key(tmp_path, verl_tree, script):
    proc = _run(script, ["--dry-run", "trainer.total_epoch=1"], _env(tmp_path, verl_tree))
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("preflight: error:")]
    assert len(errors) == 1, proc.stderr
    assert "config has no key trainer.total_epoch; did you mean trainer.total_epochs?" in errors[0]
    assert "command" not in proc.stdout


def test_inconsistent_rollout_parallel_sizes_fail_the_dry_run(tmp_path, verl_tree):
    proc = _run(
        LAUNCHERS[2],
        ["--dry-run", "actor_rollout_ref.rollout.expert_parallel_size=64"],
        _env(tmp_path, verl_tree),
    )
    assert proc.returncode == 1
    assert "expert_parallel_size 64 != tensor 2 x data 64" in proc.stderr


@pytest.mark.skipif(bool(list(Path("/dev").glob("davinci[0-9]*"))), reason="this host has an NPU")
def test_real_run_without_npu_stops_in_preflight(tmp_path, verl_tree):
    env = _env(tmp_path, verl_tree, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    proc = _run(LAUNCHERS[0], [], env)
    assert proc.returncode == 1
    assert "preflight: error: no Ascend NPU visible" in proc.stderr
    assert all(line.startswith("preflight: error:") for line in proc.stderr.splitlines())
    assert not (tmp_path / "run_log").exists()  # nothing was started


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_trainer_exit_status_survives_tee(tmp_path, verl_tree):
    """A crashing trainer makes the launcher fail with the trainer's own status, and the log has its output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "npu-smi", "exit 0\n")  # an NPU host as far as preflight can tell
    _stub(
        bin_dir / "python3",
        'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "stub trainer crashed"; exit 7; fi\n'
        f'exec "{sys.executable}" "$@"\n',
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}')
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):  # preflight reads the rows: one batch of 256
        write_rows(data / name, 256)
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    env = _env(tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(data), LOGGER="console")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = _run(
        LAUNCHERS[0],
        [f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"],
        env,
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    logs = list((tmp_path / "run_log").glob("qwen2_5_1_5b_math_single_*.log"))
    assert len(logs) == 1 and "stub trainer crashed" in logs[0].read_text()


def test_help_does_not_launch(tmp_path, verl_tree):
    for script in LAUNCHERS + [DEEPSEEK / "ray_start.sh"]:
        proc = _run(script, ["--help"], _env(tmp_path, verl_tree))
        assert proc.returncode == 0 and "bash " in proc.stdout, script


def test_wait_for_nodes_returns_when_the_cluster_is_full():
    counts = iter([1, 3, 16])
    said: list[str] = []
    alive = ray_cluster.wait_for_nodes(lambda: next(counts), 16, 60, sleep=lambda s: None, say=said.append)
    assert alive == 16
    assert said == ["ray: 1/16 nodes alive", "ray: 3/16 nodes alive", "ray: 16/16 nodes alive"]


def test_wait_for_nodes_times_out_with_one_clear_line():
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.wait_for_nodes(
            lambda: 15, 16, 30, interval=10, sleep=sleep, clock=lambda: now[0], say=lambda s: None
        )
    assert "only 15 of 16 nodes joined the Ray cluster after 30s" in str(err.value)
    assert "\n" not in str(err.value)
    assert now[0] == 30


def test_ray_start_dry_run_exports_the_interface_and_npu_resources(tmp_path, verl_tree):
    env = _env(tmp_path, verl_tree, SOCKET_IFNAME="lo")
    head = _run(DEEPSEEK / "ray_start.sh", ["--head", "--nodes", "16", "--dry-run"], env)
    assert head.returncode == 0, head.stderr
    assert "GLOO_SOCKET_IFNAME=lo HCCL_SOCKET_IFNAME=lo" in head.stdout
    assert (
        "--node-ip-address=127.0.0.1" in head.stdout and "'--resources={\"NPU\": 16}' --head" in head.stdout
    )
    worker = _run(DEEPSEEK / "ray_start.sh", ["--worker", "10.1.2.3", "--dry-run"], env)
    assert "--address=10.1.2.3:6379" in worker.stdout
    bad = _run(DEEPSEEK / "ray_start.sh", ["--head", "--dry-run"], {**env, "SOCKET_IFNAME": "no-such-if0"})
    assert bad.returncode == 1 and "interface 'no-such-if0' has no IPv4 address" in bad.stderr


@pytest.mark.skipif(bool(list(Path("/dev").glob("davinci[0-9]*"))), reason="this host has an NPU")
@pytest.mark.parametrize("npus", ["16", "8"])
def test_deepseek_npu_launch_waits_for_every_node_to_offer_its_npus(tmp_path, verl_tree, npus):
    """On NPUs the launcher waits for NNODES nodes each offering NPUS_PER_NODE `NPU` (what verl's bundles ask of a
    rank), before the trainer: the stand-in python passes the preflight and records the wait's arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "wait.args"
    _stub(
        bin_dir / "python3",
        'if [ "$1 $2 $3" = "-m ascend_rl preflight" ]; then exit 0; fi\n'
        f'if [ "$1 $2 $3 $4" = "-m ascend_rl ray_cluster wait" ]; then shift 4; echo "$*" > "{asked}"; exit 9; fi\n'
        'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "stub trainer started"; exit 7; fi\n'
        f'exec "{sys.executable}" "$@"\n',
    )
    env = _env(tmp_path, verl_tree, NNODES="2", NPUS_PER_NODE=npus)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = _run(LAUNCHERS[2], [], env)
    assert proc.returncode == 9, proc.stdout + proc.stderr  # the wait's failure ends the launch
    assert asked.read_text().split() == [
        *("--nodes", "2", "--timeout", "60", "--resource", f"NPU={npus}"),
        *(
            "--same-env",
            str(verl_tree),
        ),  # every node's Ray on this launcher's Python and verl (issue 48, item 1)
    ]
    assert "stub trainer started" not in proc.stdout
