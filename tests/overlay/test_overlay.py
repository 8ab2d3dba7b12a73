"""The overlay tool against the real verl 0.6.0 source distribution, with patches written here."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import overlay
from ascend_rl.paths import REPO

OVERLAY = ["-m", "ascend_rl", "overlay"]  # the command, as a user runs it
PIN = overlay.load_recipe("qwen2_5", "0.6.0")
PADDING = "verl/workers/roles/utils/padding.py"
PROTOCOL = "verl/protocol.py"


def tree_hash(root: Path) -> dict[str, str]:
    """sha256 of every file under root, keyed by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def make_patch(pristine: Path, tmp: Path, name: str, edits: dict[str, tuple[str, str] | str | None]) -> Path:
    """Write a patch made by `git diff` between pristine and an edited copy of the touched files.

    edits: path -> (old, new) text replacement, a str for a new file's content, None to delete.
    """
    a, b = tmp / f"{name}-a", tmp / f"{name}-b"
    for rel, edit in edits.items():
        src = pristine / rel
        if src.exists():
            (a / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, a / rel)
        if edit is None:
            continue
        (b / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(edit, str):
            (b / rel).write_text(edit)
        else:
            old, new = edit
            text = src.read_text()
            assert old in text, f"{old!r} not in {rel}"
            (b / rel).write_text(text.replace(old, new, 1))
    a.mkdir(exist_ok=True)
    b.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", a.name, b.name], cwd=tmp, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stderr
    patch = tmp / f"{name}.patch"
    patch.write_text(
        f"Description: {name} (written by the test)\nLast-Update: 2026-11-29\n---\n" + proc.stdout
    )
    return patch


def make_recipe(
    tmp: Path, patches: list[Path], version: str = PIN.version, name: str = "recipe", **upstream: str
) -> Path:
    """A recipe folder whose manifest pins verl like qwen2_5 and lists `patches`."""
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    fields = {
        "project": "verl",
        "version": version,
        "git_url": PIN.git_url,
        "tag": PIN.tag,
        "commit": PIN.commit,
        "sdist": PIN.sdist,
        "sdist_sha256": PIN.sdist_sha256,
        **upstream,
    }
    body = "[upstream]\n" + "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    body += "[patches]\nseries = [" + ", ".join(f'"{p}"' for p in patches) + "]\n"
    (folder / "recipe.toml").write_text(body)
    return folder


def cli(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *OVERLAY, *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


@pytest.fixture
def two_patches(tmp_path, pristine_verl) -> list[Path]:
    first = make_patch(
        pristine_verl,
        tmp_path,
        "0001-padding",
        {
            PADDING: (
                "from transformers.integrations.npu_flash_attention import pad_input, unpad_input",
                "from verl.utils.attention_utils import pad_input, unpad_input",
            ),
            "verl/utils/overlay_marker.py": '"""Added by the overlay test."""\nMARKER = 1\n',
        },
    )
    second = make_patch(
        pristine_verl,
        tmp_path,
        "0002-protocol",
        {PROTOCOL: ("import numpy as np\n", "import numpy as np  # patched by the overlay test\n")},
    )
    return [first, second]


def test_apply_status_reapply_revert_round_trip(tmp_path, verl_tree, two_patches):
    recipe = make_recipe(tmp_path, two_patches)
    before = tree_hash(verl_tree)

    status = cli("status", recipe, "--target", verl_tree)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("applicable") == 2

    applied = cli("apply", recipe, "--target", verl_tree)
    assert applied.returncode == 0, applied.stderr
    assert "applied 2 of 2" in applied.stdout
    text = (verl_tree / PADDING).read_text()
    assert "from verl.utils.attention_utils import pad_input, unpad_input" in text
    assert "npu_flash_attention" not in text
    assert (verl_tree / "verl/utils/overlay_marker.py").read_text().endswith("MARKER = 1\n")

    status = cli("status", recipe, "--target", verl_tree)
    assert status.returncode == 0 and status.stdout.count("applied ") == 2, status.stdout

    patched = tree_hash(verl_tree)
    again = cli("apply", recipe, "--target", verl_tree)
    assert again.returncode == 0
    assert "already applied" in again.stdout and "nothing to do" in again.stdout
    assert tree_hash(verl_tree) == patched

    reverted = cli("revert", recipe, "--target", verl_tree)
    assert reverted.returncode == 0, reverted.stderr
    assert reverted.stdout.index("0002-protocol") < reverted.stdout.index("0001-padding"), "reverse order"
    assert tree_hash(verl_tree) == before
    assert not (verl_tree / "verl/utils/overlay_marker.py").exists()

    noop = cli("revert", recipe, "--target", verl_tree)
    assert noop.returncode == 0 and "nothing to revert" in noop.stdout


def test_partly_applied_series_is_completed(tmp_path, verl_tree, two_patches):
    recipe = overlay.load_recipe(make_recipe(tmp_path, two_patches))
    only_second = overlay.load_recipe(make_recipe(tmp_path, two_patches[1:], name="second-only"))
    overlay.apply_series(only_second, verl_tree)
    states = overlay.series_status(recipe, verl_tree)
    assert [s.state for s in states] == ["applicable", "applied"]
    overlay.apply_series(recipe, verl_tree)
    assert [s.state for s in overlay.series_status(recipe, verl_tree)] == ["applied", "applied"]


def test_dry_run_changes_nothing(tmp_path, verl_tree, two_patches):
    recipe = make_recipe(tmp_path, two_patches)
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree, "--dry-run")
    assert proc.returncode == 0 and "dry run" in proc.stdout
    assert tree_hash(verl_tree) == before


def test_conflicting_patch_leaves_every_file_untouched(tmp_path, verl_tree, pristine_verl, two_patches):
    bad = make_patch(
        pristine_verl, tmp_path, "0003-conflict", {PROTOCOL: ("import numpy as np\n", "import numpy\n")}
    )
    # Break the context the third patch needs *after* it was made: it now conflicts.
    recipe = make_recipe(tmp_path, [*two_patches, bad])
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree)
    assert proc.returncode == 1
    assert tree_hash(verl_tree) == before, "a refused series must not change any file"
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "0003-conflict.patch" in err[0] and PROTOCOL in err[0] and "hunk #1" in err[0]
    # and where to see every patch's state (issue 61, item 6)
    assert f"python3 -m ascend_rl overlay status {recipe.resolve()} --target {verl_tree} shows" in err[0], (
        err[0]
    )

    status = cli("status", recipe, "--target", verl_tree)
    assert status.returncode == 1
    assert "conflicting" in status.stdout and PROTOCOL in status.stdout and "hunk #1 (@@ -" in status.stdout


def test_hand_edited_tree_is_reported_not_overwritten(tmp_path, verl_tree, two_patches):
    recipe = make_recipe(tmp_path, two_patches)
    target = verl_tree / PADDING
    target.write_text(target.read_text().replace("npu_flash_attention", "npu_flash_attention_edited"))
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree)
    assert proc.returncode == 1 and PADDING in proc.stderr
    assert tree_hash(verl_tree) == before


@pytest.mark.parametrize("bad_path", ["../outside.py", "/tmp/abs-overlay-test.py", "verl/../../escape.py"])
def test_paths_leaving_the_tree_are_refused(tmp_path, verl_tree, bad_path):
    patch = tmp_path / "evil.patch"
    patch.write_text(f"Description: escapes\n--- /dev/null\n+++ {bad_path}\n@@ -0,0 +1 @@\n+x = 1\n")
    recipe = make_recipe(tmp_path, [patch])
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and (
        "leaves the tree" in proc.stderr or "absolute" in proc.stderr
    )
    assert tree_hash(verl_tree) == before
    assert not (tmp_path / "outside.py").exists() and not Path("/tmp/abs-overlay-test.py").exists()


def test_symlink_out_of_the_tree_is_refused(tmp_path, verl_tree):
    outside = tmp_path / "outside"
    outside.mkdir()
    (verl_tree / "verl" / "link").symlink_to(outside)
    patch = tmp_path / "link.patch"
    patch.write_text(
        "Description: through a link\n--- /dev/null\n+++ b/verl/link/x.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    proc = cli("apply", make_recipe(tmp_path, [patch]), "--target", verl_tree)
    assert proc.returncode == 1 and "outside" in proc.stderr
    assert not (outside / "x.py").exists()


def test_other_verl_version_is_refused_unless_forced(tmp_path, verl_tree, two_patches):
    (verl_tree / "verl/version/version").write_text("0.5.0\n")
    recipe = make_recipe(tmp_path, two_patches)
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree)
    assert proc.returncode == 1
    assert "0.5.0" in proc.stderr and "--force" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert tree_hash(verl_tree) == before
    forced = cli("apply", recipe, "--target", verl_tree, "--force")
    assert forced.returncode == 0, forced.stderr


def test_corrupt_patch_is_refused(tmp_path, verl_tree, two_patches):
    text = two_patches[1].read_text()
    truncated = tmp_path / "0002-truncated.patch"
    truncated.write_text(text[: text.rindex("\n", 0, len(text) - 2)])  # drop the hunk's last line
    recipe = make_recipe(tmp_path, [two_patches[0], truncated])
    before = tree_hash(verl_tree)
    proc = cli("apply", recipe, "--target", verl_tree)
    assert proc.returncode == 1
    assert "0002-truncated.patch" in proc.stderr and "corrupt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert tree_hash(verl_tree) == before, "the good first patch must not be applied either"


def test_missing_patch_file_is_refused(tmp_path, verl_tree):
    proc = cli("apply", make_recipe(tmp_path, [tmp_path / "gone.patch"]), "--target", verl_tree)
    assert proc.returncode == 1 and "missing" in proc.stderr


def test_site_packages_and_git_checkout_targets(tmp_path, pristine_verl, two_patches):
    recipe = make_recipe(tmp_path, two_patches)
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_verl / "verl", site / "verl")
    (site / "other_pkg").mkdir()
    (site / "other_pkg" / "__init__.py").write_text("")
    assert cli("apply", recipe, "--target", site).returncode == 0
    assert "attention_utils" in (site / PADDING).read_text()
    assert cli("revert", recipe, "--target", site).returncode == 0
    assert tree_hash(site / "verl") == tree_hash(pristine_verl / "verl")

    checkout = tmp_path / "checkout"
    shutil.copytree(pristine_verl, checkout)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "pristine"], check=True)
    assert cli("apply", recipe, "--target", checkout).returncode == 0
    changed = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    assert PADDING in changed and PROTOCOL in changed and "overlay_marker.py" in changed
    assert cli("revert", recipe, "--target", checkout).returncode == 0
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""


def test_bad_targets_and_recipes_give_one_line(tmp_path, verl_tree, two_patches):
    recipe = make_recipe(tmp_path, two_patches)
    cases = [
        (("apply", "no_such_recipe"), 2, "unknown recipe"),
        (("apply", recipe, "--target", tmp_path / "missing"), 1, "does not exist"),
        (("apply", recipe, "--target", tmp_path), 1, "holds no verl/"),
        (("apply", recipe, "--target", verl_tree / "verl"), 1, "parent folder"),
        (("frobnicate", "qwen2_5"), 2, "invalid choice"),
    ]
    for args, code, words in cases:
        proc = cli(*args)
        assert proc.returncode == code, (args, proc.stderr)
        assert words in proc.stderr, (args, proc.stderr)
        if code == 1:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_fetch_from_sdist_and_refusals(tmp_path, verl_sdist_path, pristine_verl):
    no_git = {"git_url": "file:///nonexistent/verl.git"}
    recipe = make_recipe(tmp_path, [], **no_git)
    dest = tmp_path / "fetched"
    proc = cli("fetch", recipe, "--dest", dest)
    assert proc.returncode == 0, proc.stderr
    assert "falling back to the source distribution" in proc.stdout
    assert tree_hash(dest) == tree_hash(pristine_verl)
    again = cli("fetch", recipe, "--dest", dest)
    assert again.returncode == 0 and "nothing to fetch" in again.stdout

    # A cached archive that does not match the pinned sha256 is refused, nothing is unpacked.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / PIN.sdist).write_bytes(verl_sdist_path.read_bytes()[:-10])
    bad = cli(
        "fetch", recipe, "--dest", tmp_path / "bad", "--source", "sdist", env={"RECIPES_CACHE": str(cache)}
    )
    assert bad.returncode == 1 and "sha256" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()

    # No network: an empty cache and an unreachable index.
    offline = {
        "RECIPES_CACHE": str(tmp_path / "empty-cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    off = cli("fetch", recipe, "--dest", tmp_path / "off", env=offline)
    assert off.returncode == 1 and "check the network" in off.stderr
    assert len(off.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "off").exists()

    # A tree of another version already at the destination is not overwritten.
    (dest / "verl/version/version").write_text("0.5.0\n")
    other = cli("fetch", recipe, "--dest", dest)
    assert other.returncode == 1 and "0.5.0" in other.stderr


def test_apply_patches_sh_wrapper(tmp_path, verl_tree, two_patches):
    script = REPO / "scripts" / "apply_patches.sh"
    recipe = make_recipe(tmp_path, two_patches)
    env = {**os.environ, "PYTHON": sys.executable}
    before = tree_hash(verl_tree)

    def run(*args):
        return subprocess.run(["bash", str(script), *map(str, args)], capture_output=True, text=True, env=env)

    assert run().returncode == 2
    assert run("--help").returncode == 0
    applied = run(recipe, "--target", verl_tree)
    assert applied.returncode == 0 and "applied 2 of 2" in applied.stdout, applied.stderr
    assert run(recipe, "--target", verl_tree).stdout.count("nothing to do") == 1
    reverted = run(recipe, "--revert", "--target", verl_tree)
    assert reverted.returncode == 0 and tree_hash(verl_tree) == before
    assert run("no_such_recipe", "--target", verl_tree).returncode == 2


def test_list_takes_a_recipe_as_the_readme_shows():
    proc = cli("list", "qwen2_5", "--base", "0.6.0")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    series = overlay.load_recipe("qwen2_5", "0.6.0").series
    assert lines[0] == f"qwen2_5: verl 0.6.0, {len(series)} patches, in order:"
    default = cli("list", "qwen2_5").stdout.splitlines()[0]
    spec = overlay.load_recipe("qwen2_5")
    assert default == f"qwen2_5: verl {spec.default}, {len(spec.series)} patches, in order:"
    rows = [ln.split() for ln in lines[1:]]
    assert [r[1] for r in rows] == [str(p.relative_to(overlay.REPO)) for p in series]
    assert [r[0] for r in rows] == [p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in series]
    assert cli("list", "no_such_recipe").returncode == 2


def test_python_without_tomllib_gets_one_line(tmp_path):
    """Python 3.10 has no tomllib: the tool says what to run it with instead of a traceback."""
    blocked = (
        "import runpy, sys; sys.modules['tomllib'] = None; "
        "sys.argv = ['ascend_rl', 'overlay', 'list']; runpy.run_module('ascend_rl', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "needs Python 3.11 or newer" in proc.stderr


def test_status_names_another_recipes_series_on_the_tree(verl_tree):
    # DeepSeek's 0.6.0 series, named (its default base is 0.9.1): the status names it with its base, and so does the
    # revert it suggests
    assert cli("apply", "deepseek_r1", "--base", "0.6.0", "--target", verl_tree).returncode == 0
    status = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert status.returncode == 1 and "conflicting" in status.stdout
    n = len(overlay.load_recipe("deepseek_r1", "0.6.0").series)
    assert (
        f"this tree carries recipe deepseek_r1 --base 0.6.0's series ({n} of {n} patches applied)"
        in status.stdout
    )
    assert (
        f"(python3 -m ascend_rl overlay revert deepseek_r1 --base 0.6.0 --target {verl_tree.resolve()})"
        in status.stdout
    )
    refused = cli("apply", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert refused.returncode == 1 and "carries recipe deepseek_r1 --base 0.6.0's series" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    # On its own recipe's tree nothing foreign is reported.
    assert "carries" not in cli("status", "deepseek_r1", "--base", "0.6.0", "--target", verl_tree).stdout


def test_status_on_the_default_base_names_the_series_not_local_edits(base_tree):
    # on 0.7.1 every qwen2_5 patch may read applied under deepseek_r1's series: the files that differ from the
    # release are that series', and status says so rather than blaming local edits or a checkout between releases
    tree = base_tree("0.7.1")
    assert cli("apply", "deepseek_r1", "--base", "0.7.1", "--target", tree).returncode == 0
    status = cli("status", "qwen2_5", "--base", "0.7.1", "--target", tree)
    assert "this tree carries recipe deepseek_r1 --base 0.7.1's series" in status.stdout, status.stdout
    assert "local edits" not in status.stdout and "overlay.py" not in status.stdout + status.stderr


def test_prepare_fetches_an_absent_tree_applies_the_series_and_then_has_nothing_to_do(
    tmp_path, verl_sdist_path
):
    """overlay.prepare, the launch's way onto a tree (the preflight's, after every check passed): the pinned sdist
    fetched into an absent target and the series applied; a second call fetches nothing and applies nothing."""
    target = tmp_path / "verl-0.6.0"
    first = overlay.prepare(PIN, target)
    assert first.how == "fetched" and first.said[-1].endswith(
        f"{len(PIN.series)} of {len(PIN.series)} patches on {target}"
    )
    before = tree_hash(target)
    again = overlay.prepare(PIN, target)
    assert again.how == "" and again.said == [
        f"{PIN.name}: all {len(PIN.series)} patches already applied on {target}; nothing to do"
    ]
    assert tree_hash(target) == before


def test_prepare_refuses_a_user_tree_that_does_not_take_the_series_and_removes_nothing(tmp_path, verl_tree):
    """Not disposable (a user's VERL_DIR): the refusal names the overlay command of the step, the tree stays."""
    padding = verl_tree / PADDING
    line = "from transformers.integrations.npu_flash_attention import pad_input, unpad_input"
    assert line in padding.read_text()
    padding.write_text(padding.read_text().replace(line, "from my_npu_kernels import pad_input, unpad_input"))
    before = tree_hash(verl_tree)
    with pytest.raises(
        overlay.OverlayError, match=r"^overlay apply qwen2_5 --base 0\.6\.0 on .* failed: overlay: error: "
    ):
        overlay.prepare(PIN, verl_tree)
    assert tree_hash(verl_tree) == before
