"""Modules a patch adds to verl are real files of this repository, named in its header (`Installs:`).

The overlay turns each into a new-file diff, so apply, status, revert and the journal treat it as before; these
tests hold that, and that no diff of any series carries Python of its own any more.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_overlay import cli, make_patch, make_recipe, tree_hash

from ascend_rl import overlay, patchdoc, patchset
from ascend_rl.paths import REPO

PADDING = "verl/workers/roles/utils/padding.py"
MODULE = "verl/utils/installed_by_test.py"


def _all_patches() -> list[Path]:
    return sorted(patchdoc.all_patches())


def test_no_diff_of_any_series_creates_a_python_file():
    """Every added module lives in a .py file of the repository; a diff only changes verl's own lines."""
    created = []
    for path in _all_patches():
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"(?m)^--- /dev/null\n\+\+\+ b/(\S+\.py)$", text):
            created.append(f"{patchdoc.rel(path)}: {m.group(1)}")
    assert created == [], f"move these modules into real files and name them with Installs: {created}"


def test_every_installed_module_is_a_repository_file_that_the_parsed_patch_carries_byte_for_byte():
    seen = {}
    for path in _all_patches():
        header = patchdoc.read_header(path)
        for value in header.values("Installs"):
            dest, word, source = value.split()
            assert word == "from"
            data = (REPO / source).read_bytes()
            parsed = {fp.path: fp for fp in patchset.parse(path).files}
            assert parsed[dest].old_path is None, f"{path.name}: {dest} must be a new file"
            assert b"".join(parsed[dest].hunks[0].new) == data
            seen.setdefault(source, set()).add(dest)
    # one copy for every base: the DeepSeek modules, the reshard planner, the CPU shim and verl 0.9.1's CPU platform
    # files (the platform, the vLLM plugin, the vllm distribution record's two files) and its update-gap metrics,
    # and ds-0211's checkpoint-writer hook, each installed to one place
    assert {s: len(d) for s, d in seen.items()} == {s: 1 for s in seen}
    assert len(seen) == 14, sorted(seen)


def test_a_patched_tree_holds_the_repository_files(patched_verl):
    tree = patched_verl("deepseek_r1")
    for name, dest in [
        ("explicit_offload", "verl/utils/explicit_offload.py"),
        ("expert_reshard", "verl/utils/megatron/expert_reshard.py"),
        ("ascend_weight_sync", "verl/utils/vllm/ascend_weight_sync.py"),
        ("token_budget", "verl/utils/vllm/token_budget.py"),
    ]:
        ours = REPO / "llm_rl/deepseek_r1/verl_modules" / f"{name}.py"
        assert (tree / dest).read_bytes() == ours.read_bytes(), dest
    # the library's reshard planner, beside the module that imports it
    planner = tree / "verl/utils/megatron/moe_reshard.py"
    assert planner.read_bytes() == (REPO / "ascend_rl/moe_reshard.py").read_bytes()


def _module_patch(tmp_path: Path, pristine: Path, source: str, extra_header: str = "") -> Path:
    patch = make_patch(
        pristine,
        tmp_path,
        "tst-0001-module",
        {
            PADDING: (
                "from transformers.integrations.npu_flash_attention import pad_input, unpad_input",
                "from verl.utils.installed_by_test import pad_input, unpad_input",
            )
        },
    )
    text = patch.read_text()
    head = f"Installs: {MODULE}\n from {source}\n{extra_header}"
    patch.write_text(text.replace("Last-Update:", head + "Last-Update:", 1))
    return patch


@pytest.fixture
def module_source() -> str:
    """A module of the repository the test installs under another name."""
    return "llm_rl/deepseek_r1/verl_modules/token_budget.py"


def test_line_endings_and_a_missing_final_newline_survive_the_round_trip(tmp_path):
    data = b'"""Installed by the test."""\r\nfrom x import y  # CRLF kept\r\nZ = 1'  # no final newline
    (tmp_path / "module.py").write_bytes(data)
    patch = tmp_path / "x-0001-module.patch"
    patch.write_text("Description: d\nInstalls: verl/m.py\n from module.py\nLast-Update: 2026-12-06\n")
    (fp,) = patchset.parse(patch, root=tmp_path).files
    assert patchset.apply_file(fp, None) == data
    assert patchset.apply_file(fp.reversed(), data) is None
    with pytest.raises(patchset.HunkConflict, match="already exists"):
        patchset.apply_file(fp, b"other")


def test_apply_status_revert_of_an_installed_module_are_byte_exact(
    tmp_path, verl_tree, pristine_verl, module_source
):
    patch = _module_patch(tmp_path, pristine_verl, module_source)
    recipe = make_recipe(tmp_path, [patch])
    before = tree_hash(verl_tree)

    dry = cli("apply", recipe, "--target", verl_tree, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert tree_hash(verl_tree) == before, "a dry run wrote"

    applied = cli("apply", recipe, "--target", verl_tree)
    assert applied.returncode == 0, applied.stderr
    assert (verl_tree / MODULE).read_bytes() == (REPO / module_source).read_bytes()
    status = cli("status", recipe, "--target", verl_tree)
    assert status.returncode == 0 and "applied" in status.stdout, status.stdout
    again = cli("apply", recipe, "--target", verl_tree)
    assert again.returncode == 0 and (verl_tree / MODULE).read_bytes() == (REPO / module_source).read_bytes()

    (verl_tree / MODULE).write_bytes(b"edited by hand\n")
    edited = cli("revert", recipe, "--target", verl_tree)
    assert edited.returncode != 0, edited.stdout
    assert (verl_tree / MODULE).read_bytes() == b"edited by hand\n", "a refused revert changed the file"
    (verl_tree / MODULE).write_bytes((REPO / module_source).read_bytes())

    reverted = cli("revert", recipe, "--target", verl_tree)
    assert reverted.returncode == 0, reverted.stderr
    assert not (verl_tree / MODULE).exists()
    assert tree_hash(verl_tree) == before


def test_an_existing_file_at_the_destination_refuses_the_whole_series(
    tmp_path, verl_tree, pristine_verl, module_source
):
    patch = _module_patch(tmp_path, pristine_verl, module_source)
    (verl_tree / MODULE).write_text("someone else's module\n")
    before = tree_hash(verl_tree)
    out = cli("apply", make_recipe(tmp_path, [patch]), "--target", verl_tree)
    assert out.returncode != 0
    assert "installed_by_test.py" in out.stderr + out.stdout
    assert tree_hash(verl_tree) == before, "nothing may change when one entry conflicts"


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("Installs: verl/x.py\n from tests/no_such_module.py\n", "cannot be read"),
        ("Installs: verl/x.py from\n", "is not 'Installs: DEST from SOURCE'"),
        ("Installs: verl/x.py\n from ../outside.py\n", "leaves the tree"),
        ("Installs: ../x.py\n from ascend_rl/paths.py\n", "leaves the tree"),
        ("Installs: /etc/x.py\n from ascend_rl/paths.py\n", "is absolute"),
    ],
)
def test_a_bad_installs_field_is_one_line_and_changes_nothing(
    tmp_path, verl_tree, pristine_verl, field, message
):
    patch = make_patch(
        pristine_verl, tmp_path, "tst-0001-bad", {PADDING: ("import torch\n", "import torch  # t\n")}
    )
    patch.write_text(patch.read_text().replace("Last-Update:", field + "Last-Update:", 1))
    with pytest.raises(patchset.PatchError, match=re.escape(message)):
        patchset.parse(patch)
    before = tree_hash(verl_tree)
    out = cli("apply", make_recipe(tmp_path, [patch]), "--target", verl_tree)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert tree_hash(verl_tree) == before


def test_a_source_symlinked_out_of_the_repository_is_refused(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("X = 1\n")
    root = tmp_path / "repo"
    root.mkdir()
    (root / "link.py").symlink_to(outside)
    patch = tmp_path / "x-0001-link.patch"
    patch.write_text("Description: d\nInstalls: verl/x.py from link.py\n")
    with pytest.raises(patchset.PatchError, match="leaves the repository"):
        patchset.parse(patch, root=root)
    shutil.copy(outside, root / "real.py")
    patch.write_text("Description: d\nInstalls: verl/x.py from real.py\n")
    assert [fp.path for fp in patchset.parse(patch, root=root).files] == ["verl/x.py"]


def test_the_recipes_series_status_names_each_installed_module(tmp_path, pristine_verl):
    tree = tmp_path / "tree"
    shutil.copytree(pristine_verl, tree, symlinks=True)
    recipe = overlay.load_recipe("deepseek_r1", "0.6.0")
    overlay.apply_series(recipe, tree)
    states = overlay.series_status(recipe, tree)
    assert {s.state for s in states} == {overlay.APPLIED}
    offload = next(s for s in states if s.patch.name.startswith("ds-0004"))
    assert "verl/utils/explicit_offload.py" in [fp.path for fp in offload.patch.files]


def test_export_gives_plain_diffs_that_git_apply_turns_into_the_overlays_tree(
    tmp_path, pristine_verl, patched_verl
):
    """For users of git apply, patch -p1 or quilt: the exported series, applied in order by git, gives the tree
    the overlay gives, byte for byte; the export refuses a folder that is not empty."""
    out = tmp_path / "export"
    done = cli("export", "deepseek_r1", "--base", "0.6.0", "--out", out)
    assert done.returncode == 0, done.stderr
    names = (out / "series").read_text().split()
    assert names == [p.name for p in overlay.load_recipe("deepseek_r1", "0.6.0").series]
    assert not any("Installs:" in (out / n).read_text() for n in names)
    tree = tmp_path / "tree"
    shutil.copytree(pristine_verl, tree, symlinks=True)
    for name in names:
        applied = subprocess.run(["git", "apply", str(out / name)], cwd=tree, capture_output=True, text=True)
        assert applied.returncode == 0, f"{name}: {applied.stderr}"
    assert tree_hash(tree) == tree_hash(patched_verl("deepseek_r1"))
    again = cli("export", "deepseek_r1", "--out", out)
    assert again.returncode == 1 and "not an empty folder" in again.stderr
