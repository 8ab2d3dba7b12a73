"""What verl rejects only after Ray started, refused by the preflight before anything starts; a dry run that writes
nothing; a refused launch that writes nothing either; the messages that point the right way.

Each launch runs the real launcher against a fresh copy of the pinned verl 0.6.0 sdist (VERL_DIR), as a user with
their own tree does: the refusals come from that tree's own validate_config.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ascend_rl import preflight
from ascend_rl.overlay import load_recipe
from ci_policy import artifact_error_in
from launcher_env import launcher_env, run_launcher, write_rows

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
QWEN4 = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b.sh"
DEEPSEEK = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"


def _refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused launch (no traceback, no command printed)."""
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("preflight: error:")]
    assert len(errors) == 1, proc.stderr
    assert not any(ln.startswith(("command", "node ")) for ln in proc.stdout.splitlines())
    return errors[0]


@pytest.mark.parametrize(
    "script,args,env,said",
    [
        (
            QWEN,
            ["actor_rollout_ref.actor.ppo_mini_batch_size=512"],
            {},
            "train_batch_size (256) must be >= actor.ppo_mini_batch_size (512)",
        ),
        (QWEN, ["data.train_batch_size=-4"], {}, "train_batch_size (-4) must be >="),
        (
            QWEN4,
            [],
            {"NPUS": "3"},
            "real_train_batch_size (2048) must be divisible by minimal possible batch size (3)",
        ),
    ],
    ids=["mini-batch-over-batch", "negative-batch", "npus-3"],
)
def test_what_verls_validate_config_rejects_is_refused_before_the_launch(
    tmp_path, verl_tree, script, args, env, said
):
    line = _refused(run_launcher(script, ["--dry-run", *args], launcher_env(tmp_path, verl_tree, **env)))
    assert said in line and "verl refuses the config" in line


def test_trainer_nnodes_against_nnodes_is_refused_and_no_nodes_are_planned(tmp_path, verl_tree):
    proc = run_launcher(DEEPSEEK, ["--dry-run", "trainer.nnodes=8"], launcher_env(tmp_path, verl_tree))
    line = _refused(proc)
    assert "trainer.nnodes=8 but NNODES=16" in line and "NNODES=8" in line
    assert "ray_start.sh" not in proc.stdout + proc.stderr
    # one number, given once, is taken
    ok = run_launcher(DEEPSEEK, ["--dry-run"], launcher_env(tmp_path, verl_tree, NNODES="8"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.count("ray_start.sh") == 8 and "after all 8 nodes joined" in ok.stdout


@pytest.mark.parametrize(
    "arg,near",
    [
        ("actor_rollout_ref.actor.optim.lrr=1e-6", "did you mean actor_rollout_ref.actor.optim.lr?"),
        ("LOGGER=console", "did you mean trainer.logger?"),
    ],
    ids=["lrr", "env-var-as-argument"],
)
def test_a_misspelt_key_names_the_nearest_real_ones(tmp_path, verl_tree, arg, near):
    line = _refused(run_launcher(QWEN, ["--dry-run", arg], launcher_env(tmp_path, verl_tree)))
    assert near in line
    assert "+" + arg not in line and "prefix" not in line  # not Hydra's advice to add the key


def test_an_environment_variable_passed_as_an_argument_says_where_it_goes(tmp_path, verl_tree):
    line = _refused(run_launcher(QWEN, ["--dry-run", "LOGGER=console"], launcher_env(tmp_path, verl_tree)))
    assert "LOGGER=console bash" in line


def _qwen_model(folder: Path, config: str = '{"model_type": "qwen2"}') -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config)
    (folder / "tokenizer_config.json").write_text('{"chat_template": "the download\'s own"}')
    return folder


def _data(folder: Path, rows: int = 300) -> Path:
    folder.mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        write_rows(folder / name, rows)
    return folder


def test_malformed_config_json_is_one_model_line_not_a_garbled_tokenizer_one(tmp_path, verl_tree):
    model = _qwen_model(tmp_path / "model", '{"model_type": ')
    env = launcher_env(tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(_data(tmp_path / "data")))
    proc = run_launcher(QWEN, ["trainer.logger=[console]", "--dry-run"], env)
    line = _refused(proc)
    assert f"{model}/config.json is not a JSON object" in line
    assert "error: error" not in proc.stderr and "model      ok" not in proc.stdout


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (symlinks by target), for a byte-for-byte comparison."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = os.readlink(path).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = b"<dir>"
    return out


def test_a_dry_run_leaves_every_byte_of_the_users_tree_and_model_folder(tmp_path, verl_tree):
    model = _qwen_model(tmp_path / "model")
    env = launcher_env(tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(_data(tmp_path / "data")))
    tree_before, model_before = _snapshot(verl_tree), _snapshot(model)
    for args in (["--dry-run"], ["--dry-run", "--json"], ["--cpu", "--dry-run"]):
        proc = run_launcher(QWEN, args, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert _snapshot(verl_tree) == tree_before, args
        assert _snapshot(model) == model_before, args
    # ... and says what a real launch would change there
    proc = run_launcher(QWEN, ["--dry-run"], env)
    changes = proc.stdout.split("a real launch changes, before the trainer starts:\n")[1].split(
        "key settings:"
    )[0]
    n = len(load_recipe("qwen2_5", "0.6.0").series)  # the manifest's series, not a count kept here
    assert f"verl tree: apply the {n} patches of qwen2_5 (verl 0.6.0) to {verl_tree}" in changes
    assert f"back up {model}/tokenizer_config.json" in changes and "install " in changes
    plan = json.loads(run_launcher(QWEN, ["--dry-run", "--json"], env).stdout)
    assert (
        any(c.startswith("verl tree: apply") for c in plan["changes"]) and plan["verl"]["version"] == "0.6.0"
    )
    assert not (tmp_path / "run_log").exists()


def _npu_host(tmp_path: Path, verl_tree: Path, trainer_says: str, logger: str) -> tuple[Path, dict]:
    """A Qwen model and a launch environment on an NPU host as far as the preflight sees (a stub npu-smi),
    whose trainer (python3 -m verl.trainer.main_ppo) only echoes trainer_says; (the model folder, the env)."""
    model = _qwen_model(tmp_path / "model")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "python3").write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "{trainer_says}"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = launcher_env(
        tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(_data(tmp_path / "data")), LOGGER=logger
    )
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return model, env


def test_a_refused_launch_writes_nothing_and_a_passing_one_writes_after_its_checks(tmp_path, verl_tree):
    model, env = _npu_host(tmp_path, verl_tree, "FILE_LOGGER_ROOT=$VERL_FILE_LOGGER_ROOT", "console,file")
    tree_before, model_before = _snapshot(verl_tree), _snapshot(model)
    _refused(run_launcher(QWEN, ["actor_rollout_ref.actor.ppo_mini_batch_size=512"], env))
    assert _snapshot(verl_tree) == tree_before and _snapshot(model) == model_before
    # every check passes: the series goes on the tree, the recipe's tokenizer config into the model folder
    proc = run_launcher(QWEN, [], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _snapshot(verl_tree) != tree_before
    assert (model / "tokenizer_config.json").read_bytes() == (
        QWEN.parent / "tokenizer_config.json"
    ).read_bytes()
    assert (model / "tokenizer_config.json.orig").read_text() == '{"chat_template": "the download\'s own"}'
    # verl's file logger writes under LOG_DIR, not into the recipe folder the trainer runs in
    assert f"FILE_LOGGER_ROOT={tmp_path}/run_log" in proc.stdout


def test_a_logger_backend_whose_package_is_absent_fails_its_check(monkeypatch):
    """check_logger fails a trainer.logger backend whose package this Python lacks, naming the pip install (verl
    imports it only once Ray started); console and the backends whose package is there pass."""
    real = importlib.util.find_spec
    present = {"tensorboard"}

    def find_spec(name, *args, **kwargs):
        if name in preflight.LOGGER_MODULES.values():
            return importlib.machinery.ModuleSpec(name, None) if name in present else None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    ok = preflight.check_logger(OmegaConf.create({"trainer": {"logger": ["console", "tensorboard"]}}))
    assert (ok.name, ok.status) == ("logger", "ok")
    bad = preflight.check_logger(
        OmegaConf.create({"trainer": {"logger": ["console", "wandb", "tensorboard"]}})
    )
    assert (bad.name, bad.status) == ("logger", "FAIL")
    assert bad.detail.startswith("trainer.logger wandb needs `pip install wandb`"), bad.detail


@pytest.mark.skipif(
    importlib.util.find_spec("swanlab") is not None, reason="this Python has swanlab installed"
)
def test_a_launch_whose_logger_package_is_absent_is_refused_before_the_trainer_starts(tmp_path, verl_tree):
    """A real launch (stub npu-smi and trainer, every other check passing) with LOGGER=console,swanlab and no
    swanlab in this Python is refused in one line naming the install; the trainer never starts, nothing is
    written."""
    model, env = _npu_host(tmp_path, verl_tree, "TRAINER STARTED", "console,swanlab")
    tree_before, model_before = _snapshot(verl_tree), _snapshot(model)
    proc = run_launcher(QWEN, [], env)
    line = _refused(proc)
    assert "trainer.logger swanlab needs `pip install swanlab`" in line, line
    assert "TRAINER STARTED" not in proc.stdout + proc.stderr
    assert _snapshot(verl_tree) == tree_before and _snapshot(model) == model_before


def test_a_value_left_at_question_marks_is_refused_by_name(pristine_verl):
    """A mandatory value (???) left unset is refused when the config is composed, by its key: verl 0.6.0's
    ppo_trainer leaves actor_rollout_ref.rollout.name at ??? (the launchers set it). missing_values finds each
    one, nested too, except in a section its own `enable: False` switches off."""
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.compose(pristine_verl, "ppo_trainer", [])
    assert "the config leaves actor_rollout_ref.rollout.name without a value (???)" in str(refused.value)
    cfg = preflight.compose(pristine_verl, "ppo_trainer", ["actor_rollout_ref.rollout.name=vllm"])
    assert preflight.missing_values(cfg) == []
    made = OmegaConf.create(
        {"a": "???", "b": {"c": "???", "d": 1, "e": {"f": "???"}}, "off": {"enable": False, "g": "???"}}
    )
    assert preflight.missing_values(made) == ["a", "b.c", "b.e.f"]


def test_the_cpu_profile_says_make_e2e_builds_its_model_and_data(tmp_path, verl_tree):
    env = launcher_env(
        tmp_path, verl_tree, MODEL_DIR=str(tmp_path / "no-model"), DATA_DIR=str(tmp_path / "no-data")
    )
    proc = run_launcher(QWEN, ["--cpu"], env)
    assert proc.returncode == 1
    model = next(ln for ln in proc.stderr.splitlines() if "no-model" in ln)
    data = next(ln for ln in proc.stderr.splitlines() if "no-data" in ln)
    assert "make e2e builds it there" in model and "download" not in model
    assert "make e2e builds them there" in data


@pytest.mark.parametrize("recipe", ["qwen2_5", "deepseek_r1"])
def test_the_cpu_profiles_say_the_answer_length_they_set(recipe):
    text = (REPO / "llm_rl" / recipe / "cpu_profile.sh").read_text()
    said = re.search(r"(\d+)-token answers", text)
    assert said, "the profile's comment names its answer length"
    assert f"data.max_response_length={said.group(1)}\n" in text


def test_the_printed_command_is_one_override_a_line_and_composes_the_same_config(tmp_path, verl_tree):
    from omegaconf import OmegaConf

    from ascend_rl import overlay, preflight

    extra = ["trainer.total_epochs=1", "+trainer.probe=a", "trainer.probe=b", "trainer.total_epochs=2"]
    proc = run_launcher(QWEN, ["--dry-run", *extra], launcher_env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("command ("))
    command = lines[start + 1 :]
    assert all(ln.endswith(" \\") for ln in command[:-1]) and not command[-1].endswith("\\")
    assert max(len(ln) for ln in command[1:]) < 300
    shown = [shlex.split(ln.removesuffix("\\"))[0] for ln in command[1:]]
    assert shown.count("trainer.total_epochs=2") == 1 and "trainer.total_epochs=1" not in shown
    assert "+trainer.probe=b" in shown
    plan = json.loads(
        run_launcher(QWEN, ["--dry-run", "--json", *extra], launcher_env(tmp_path, verl_tree)).stdout
    )
    given = plan["override_args"]
    assert len(shown) < len(given) and preflight.resolved_overrides(given) == [
        shlex.split(s)[0] for s in shown
    ]
    # the printed overrides compose the config the launcher's full list composes
    overlay.apply_series(overlay.load_recipe("qwen2_5", "0.6.0"), verl_tree, log=lambda m: None)
    same = [OmegaConf.to_container(preflight.compose(verl_tree, "ppo_trainer", o)) for o in (given, shown)]
    assert same[0] == same[1]


def test_deepseek_help_ends_with_its_text():
    """--help prints the launcher's header comment, every line of it and nothing of the script after it."""
    lines = DEEPSEEK.read_text().splitlines()[1:]
    comment = lines[: next(i for i, ln in enumerate(lines) if not ln.startswith("#"))]
    text = [re.sub(r"^# ?", "", ln) for ln in comment]
    assert len(text) > 10 and text[0].startswith("DeepSeek-R1 GRPO")
    proc = subprocess.run(["bash", str(DEEPSEEK), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.splitlines() == text, proc.stdout
    assert "set -euo pipefail" not in proc.stdout


def test_ray_cluster_plan_refuses_no_nodes():
    proc = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "ray_cluster", "plan", "--nodes", "0", "--", "echo", "hi"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--nodes: must be a node count (1 or more), not '0'" in proc.stderr


def test_the_deepseek_cpu_plan_shows_the_cpu_command(tmp_path, verl_tree):
    proc = run_launcher(DEEPSEEK, ["--cpu", "--dry-run"], launcher_env(tmp_path, verl_tree))
    if proc.returncode != 0 and "megatron-core for the CPU profile cannot be installed" in proc.stderr:
        # a failure, or (locally, for an unreachable package index) a skip: tests/ci_policy.py
        artifact_error_in("megatron-core for the CPU profile", proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ray_start.sh --head" not in proc.stdout and "--worker" not in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith("bash llm_rl/deepseek_r1/run_deepseek_r1_a3.sh --cpu --base 0.6.0"), last


def test_errors_follow_the_report_when_both_go_to_one_file(tmp_path, verl_tree):
    log = tmp_path / "out.txt"
    env = launcher_env(tmp_path, verl_tree)
    env.pop("PYTHONUNBUFFERED", None)  # a file gets block-buffered stdout, as a user's `> log 2>&1` does
    with open(log, "w") as fh:
        proc = subprocess.run(
            ["bash", str(QWEN), "--dry-run", "custom_reward_function.name=compute_scor"],
            stdout=fh,
            stderr=fh,
            env=env,
            timeout=300,
        )
    assert proc.returncode == 1
    text = log.read_text().splitlines()
    first_error = next(i for i, ln in enumerate(text) if ln.startswith("preflight: error:"))
    table = [i for i, ln in enumerate(text) if ln.startswith("  ")]
    assert table and max(table) < first_error, text


@pytest.mark.parametrize(
    "script,args,said",
    [
        (
            QWEN,
            ["actor_rollout_ref.rollout.n=0"],
            "actor_rollout_ref.rollout.n=0 with algorithm.adv_estimator=grpo",
        ),
        (
            QWEN,
            ["actor_rollout_ref.rollout.n=1"],
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=grpo",
        ),
        (
            QWEN,
            ["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"],
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=rloo",
        ),
        (
            DEEPSEEK,
            ["actor_rollout_ref.rollout.n=1"],
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=grpo",
        ),
    ],
    ids=["qwen-n0", "qwen-n1", "qwen-rloo-n1", "deepseek-n1"],
)
def test_a_group_relative_estimator_with_fewer_than_two_samples_is_refused_in_one_line(
    tmp_path, verl_tree, script, args, said
):
    # verl's own validate_config accepts n=0 and n=1: only the preflight's group check stands between them and a run
    line = _refused(run_launcher(script, ["--dry-run", *args], launcher_env(tmp_path, verl_tree)))
    assert said in line and "set actor_rollout_ref.rollout.n to 2 or more" in line


def test_two_samples_per_prompt_and_a_non_group_estimator_pass_the_group_check():
    cfg = OmegaConf.create(
        {"algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"rollout": {"n": 2}}}
    )
    assert preflight.check_group(cfg).status == "ok"
    cfg.algorithm.adv_estimator = "gae"  # PPO's critic baseline needs no group
    cfg.actor_rollout_ref.rollout.n = 1
    assert preflight.check_group(cfg).status == "ok"
    cfg.algorithm.adv_estimator = "grpo_passk"
    assert preflight.check_group(cfg).status == "FAIL"
