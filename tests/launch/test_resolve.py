"""One resolution of (recipe, base, profile): manifest.resolve_launch and the `resolve` command the launchers eval."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ascend_rl import manifest
from ascend_rl.errors import OverlayError, UsageError
from ascend_rl.paths import REPO


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "resolve", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("recipe", manifest.recipe_names())
def test_each_base_and_profile_resolves_to_its_tree_and_die(recipe):
    first = manifest.load_recipe(recipe)
    for base in first.bases:
        npu = manifest.resolve_launch(recipe, base)
        assert npu.base == base and npu.verl_dir.name == f"verl-{base}" and npu.die in ("A2", "A3")
        if base not in manifest.overlay_series(manifest.overlay_manifests()["cpu"]):
            # a base the CPU overlay has no series for yet (qwen2_5 0.9.1): the CPU launch is refused in one line
            with pytest.raises(
                OverlayError, match=f'add a \\[bases."{base}"\\] series to patches/cpu/overlay.toml'
            ):
                manifest.resolve_launch(recipe, base, "cpu")
            continue
        cpu = manifest.resolve_launch(recipe, base, "cpu")
        assert cpu.verl_dir.name == f"verl-{base}-cpu"
        assert cpu.recipe.series[: len(npu.recipe.series)] == npu.recipe.series
        assert len(cpu.recipe.series) > len(npu.recipe.series), "the CPU overlay's series comes on top"
    assert manifest.resolve_launch(recipe).base == first.default


def test_the_shell_form_evals_into_the_launchers_variables():
    launch = manifest.resolve_launch("deepseek_r1", "0.7.1", "cpu")
    script = (
        launch.shell() + '\nprintf "%s\\n" "$VERL_BASE" "$RECIPE_TREE" "$RECIPE_DIE" "${#BASE_OVERRIDES[@]}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )
    assert out[:4] == ["0.7.1", str(launch.verl_dir), "A3", str(len(launch.recipe.overrides))]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["qwen2_5", "--base", "0.8.0"],
            "recipe qwen2_5 has no verl base 0.8.0; its bases: 0.6.0, 0.7.1, 0.9.1",
        ),
        (
            ["deepseek_r1", "--base", "0.9"],
            "recipe deepseek_r1 has no verl base 0.9; its bases: 0.6.0, 0.7.1",
        ),
        (["qwen2_5", "--profile", "gpu"], "profile must be one of npu, cpu"),
        (["llama"], "unknown recipe 'llama'"),
    ],
)
def test_an_unknown_base_recipe_or_profile_is_one_line_and_exit_2(args, message):
    out = _cli(*args, "--shell")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr and "Traceback" not in out.stderr


def test_the_json_form_names_the_series_in_order():
    out = _cli("qwen2_5", "--base", "0.6.0")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    want = [str(p.relative_to(REPO)) for p in manifest.load_recipe("qwen2_5", "0.6.0").series]
    assert data["series"] == want and data["base"] == "0.6.0" and data["default_base"] == "0.9.1"
    with pytest.raises(UsageError):
        manifest.resolve_launch("qwen2_5", "0.5.0")


@pytest.mark.parametrize("recipe", manifest.recipe_names())
def test_the_reward_is_the_manifests_one_file_and_its_function_takes_verls_call(recipe):
    """Each recipe.toml names its reward ([reward] path, function); the resolution hands it on as an absolute path,
    and verl's naive reward manager could call that function in that file (the preflight's own reading of it)."""
    from ascend_rl import preflight

    launch = manifest.resolve_launch(recipe)
    assert launch.reward is not None and launch.reward.is_file() and launch.reward.is_relative_to(REPO)
    assert preflight.reward_function_problem(launch.reward, launch.reward_function, "naive", {}) is None
    data = json.loads(_cli(recipe).stdout)
    assert data["reward"] == {"path": str(launch.reward), "function": launch.reward_function}
    assert data["pin"]["sdist_sha256"] == launch.recipe.sdist_sha256 and data["die"] == launch.die
    script = launch.shell() + '\nprintf "%s\\n" "$RECIPE_REWARD" "$RECIPE_REWARD_FN"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [str(launch.reward), launch.reward_function]


def test_the_deepseek_recipe_scores_with_the_one_reward_file_users_copy():
    rewards = {manifest.resolve_launch(r).reward for r in manifest.recipe_names()}
    assert rewards == {REPO / "llm_rl" / "qwen2_5" / "new_math_reward.py"}


def test_an_overlay_the_profile_does_not_imply_goes_on_top_into_its_own_tree():
    """The preflight's --with: the overlay's series on top of the recipe's, its tree the overlay's own (disposable);
    the npu profile with no overlay names the recipe's tree, which is never disposable."""
    npu = manifest.resolve_launch("qwen2_5", "0.6.0")
    assert npu.overlay == "" and not npu.disposable
    cpu_series = manifest.resolve_launch("qwen2_5", "0.6.0", "npu", overlay="cpu")
    assert cpu_series.verl_dir.name == "verl-0.6.0-cpu" and cpu_series.disposable
    assert cpu_series.overrides == npu.overrides, "the overlay alone adds no CPU overrides"
    with pytest.raises(UsageError, match="unknown overlay 'gpu'"):
        manifest.resolve_launch("qwen2_5", overlay="gpu")


def test_the_random_checkpoint_flag_reaches_the_launcher_and_a_bad_one_is_a_malformed_manifest(tmp_path):
    """recipe.toml's random_checkpoint (the 0.9.1 base's --variant random writes a random checkpoint): BASE_RANDOM_
    CHECKPOINT in the shell form, 1 there and 0 where load_weight=False does it; anything but true / false refused."""
    for base, want in (("0.9.1", "1"), ("0.7.1", "0")):
        script = (
            manifest.resolve_launch("deepseek_r1", base).shell() + '\nprintf "%s" "$BASE_RANDOM_CHECKPOINT"'
        )
        assert (
            subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout == want
        )
    folder = tmp_path / "deepseek_r1"
    folder.mkdir()
    text = (REPO / "llm_rl/deepseek_r1/recipe.toml").read_text()
    assert text.count("\nrandom_checkpoint = true\n") == 1
    (folder / "recipe.toml").write_text(
        text.replace("\nrandom_checkpoint = true\n", '\nrandom_checkpoint = "yes"\n')
    )
    with pytest.raises(OverlayError, match="malformed manifest.*random_checkpoint must be true or false"):
        manifest.load_recipe(folder, "0.9.1")
