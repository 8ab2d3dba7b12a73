"""Bases in the manifest and an overlay that knows which tree it is given.

Each test runs the overlay command as a user types it (python3 -m ascend_rl overlay ...) on real trees: the
pinned sdists, and the original guide's commit 634bd935 from ../shared/trees (skipped, with the reason,
where that folder is absent).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from ascend_rl import manifest, overlay, patchset, trees
from ascend_rl.errors import OverlayError, UsageError
from ascend_rl.paths import REPO

GUIDE_ARCHIVE = trees.SHARED_TREES / "verl-634bd935.tar.gz"


def cli(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "overlay", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def guide_tree(tmp_path_factory) -> Path:
    if not GUIDE_ARCHIVE.is_file():
        pytest.skip(f"{GUIDE_ARCHIVE} is absent (a clone outside this workspace)")
    dest = tmp_path_factory.mktemp("guide")
    with tarfile.open(GUIDE_ARCHIVE) as tar:
        tar.extractall(dest, filter="data")
    return dest / "verl-634bd935"


def test_each_recipe_names_its_bases_and_a_default() -> None:
    for name in manifest.recipe_names():
        specs = manifest.recipe_bases(name)
        assert specs and all(s.version in s.bases for s in specs)
        assert specs[0].default in specs[0].bases
        cpu_bases = manifest.overlay_series(manifest.overlay_manifests()["cpu"])
        for spec in specs:
            assert spec.default_target == REPO / "llm_rl" / name / f"verl-{spec.version}"
            if spec.version in cpu_bases:
                assert manifest.with_overlay(spec, "cpu").default_target.name == f"verl-{spec.version}-cpu"
            else:  # a base the CPU overlay has no series for yet (0.9.1): refused in one line, saying what to add
                with pytest.raises(
                    OverlayError, match=f'add a \\[bases."{spec.version}"\\] series to patches/cpu/'
                ):
                    manifest.with_overlay(spec, "cpu")
    with pytest.raises(UsageError, match="has no verl base 9.9.9; its bases: "):
        manifest.load_recipe("qwen2_5", "9.9.9")


def test_a_base_the_cpu_overlay_has_no_series_for_is_refused_saying_what_to_add() -> None:
    """Every base of today's recipes has a CPU series (0.9.1 since issue 45); a recipe on a base without one (here
    the 0.9.1 recipe relabelled 9.9.9) is refused in one line naming the table to add."""
    spec = replace(manifest.load_recipe("qwen2_5", "0.9.1"), version="9.9.9")
    with pytest.raises(OverlayError, match=r'add a \[bases."9.9.9"\] series to patches/cpu/overlay.toml'):
        manifest.with_overlay(spec, "cpu")


def test_the_known_trees_file_fingerprints_every_base() -> None:
    known = {t.key: t for t in trees.load_known()}
    bases = {b for name in manifest.recipe_names() for b in manifest.load_recipe(name).bases}
    assert bases <= set(known)
    for base in bases:
        assert known[base].version == base and known[base].base and known[base].files


def test_a_pristine_base_tree_is_recognised_by_content(pristine_verl: Path) -> None:
    match = trees.identify(trees.disk_reader(pristine_verl), overlay.tree_version(pristine_verl))
    assert match is not None and match.exact and match.tree.key == "0.6.0"


def test_the_guides_commit_is_named_and_refused_with_what_to_run(guide_tree: Path) -> None:
    before = tree_bytes(guide_tree)
    for verb in ("status", "apply"):
        proc = cli(verb, "qwen2_5", "--base", "0.6.0", "--target", guide_tree)
        err = proc.stderr.strip()
        assert proc.returncode == 1 and len(err.splitlines()) == 1, proc.stderr
        assert "634bd935" in err and "original Qwen2.5 guide" in err and "--base 0.6.0" in err
    assert tree_bytes(guide_tree) == before


def test_another_0_5_0_dev_tree_is_not_taken_for_the_guides(guide_tree: Path, tmp_path: Path) -> None:
    guide = {t.key: t for t in trees.load_known()}["634bd935"]
    other = tmp_path / "other"
    shutil.copytree(guide_tree, other)
    changed = 0
    # a different tree that reads 0.5.0.dev too: 20 of the files the guide's tree has (the record also lists files
    # new patches add, absent there, which an edit cannot change)
    for rel in [f for f in sorted(guide.files) if guide.files[f] != "absent"][:20]:
        path = other / rel
        if path.is_file():
            path.write_bytes(path.read_bytes() + b"\n# another commit\n")
            changed += 1
    assert 0 < changed < len(guide.files)
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", other)
    err = proc.stderr.strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1, proc.stderr
    # Named as a 0.5.0.dev tree that is like the guide's in so many files, never as the guide's commit.
    same = len(guide.files) - changed
    assert err.startswith(
        f"overlay: error: {other} is verl 0.5.0.dev (like {guide.label} in {same} of {len(guide.files)} files "
        "the series touch), not a base of qwen2_5 (its bases: "
    ), err
    assert f"is {guide.label}" not in err and "it is not a base here" not in err


def test_status_on_the_guides_tree_says_patch_by_patch(guide_tree: Path) -> None:
    # The guide's own edits (its section 4.3 seds), then our 0.6.0 series' status with --force.
    edited = guide_tree.parent / "guide-edited"
    shutil.copytree(guide_tree, edited)
    utils = edited / "verl" / "utils" / "vllm" / "utils.py"
    utils.write_text(utils.read_text().replace("from vllm.lora.models", "from vllm.lora.lora_model"))
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", edited, "--force")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    states = {
        ln.split()[1]: ln.split()[0]
        for ln in lines
        if ln.split()[1:2] and ln.split()[1].startswith("shared-")
    }
    assert states["shared-0004"] == "applicable" and states["shared-0001"] == "conflicting"
    assert "hunks already read as the patch makes them" in proc.stdout  # shared-0002's lora import
    assert "next:" in proc.stdout


def test_applied_then_edited_is_told_apart_from_conflicting(verl_tree: Path) -> None:
    recipe = manifest.load_recipe("qwen2_5", "0.6.0")
    overlay.apply_series(recipe, verl_tree, log=lambda m: None)
    target = next(p for p in recipe.series if patchset.patch_id(p) == "shared-0007")
    fp = patchset.parse(target).files[0]
    added = next(ln for ln in fp.hunks[0].new if ln not in fp.hunks[0].old and ln.strip())
    path = verl_tree / fp.path
    path.write_bytes(path.read_bytes().replace(added, added.rstrip(b"\n") + b"  # my local change\n", 1))
    edited = tree_bytes(verl_tree)

    status = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert status.returncode == 1
    row = next(ln for ln in status.stdout.splitlines() if "shared-0007" in ln)
    assert row.split()[0] == "edited", status.stdout
    assert "applied, then edited: " + fp.path in status.stdout
    assert "(the patch expects)" in status.stdout and "# my local change" in status.stdout
    assert "restore them as the patch has them" in status.stdout

    revert = cli("revert", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert (
        revert.returncode == 1
        and "shared-0007-file-logger-numpy-scalars.patch was applied, then edited" in revert.stderr
    )
    assert "nothing was changed" in revert.stderr and tree_bytes(verl_tree) == edited


def test_a_fix_another_tree_already_has_is_carried_not_conflicting(verl_tree: Path) -> None:
    recipe = manifest.load_recipe("qwen2_5", "0.6.0")
    target = next(p for p in recipe.series if patchset.patch_id(p) == "shared-0007")
    patch = patchset.parse(target)
    fp = patch.files[0]
    path = verl_tree / fp.path
    patched = patchset.apply_file(fp, path.read_bytes())
    # the same fix inside other surroundings: every added line there, the context moved on
    context = next(ln for ln in fp.hunks[0].old if ln.strip() and ln in fp.hunks[0].new)
    path.write_bytes(patched.replace(context, context.rstrip(b"\n") + b"  # upstream reworded\n", 1))
    (verl_tree / "verl" / "version" / "version").write_text("0.6.1")
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree, "--force")
    row = next(ln for ln in proc.stdout.splitlines() if "shared-0007" in ln)
    assert row.split()[0] == "carried", proc.stdout
    assert "already carried: " in proc.stdout and "every line it adds is already in the tree" in proc.stdout


def test_a_pip_installed_tree_is_told_that_reinstalling_drops_the_patches(verl_tree: Path) -> None:
    (verl_tree / "verl-0.6.0.dist-info").mkdir()
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert proc.returncode == 0, proc.stderr
    assert "pip-installed verl: reinstalling verl" in proc.stdout and "drops the patches" in proc.stdout


def test_list_shows_every_base_and_its_tree() -> None:
    proc = cli("list")
    assert proc.returncode == 0
    for name in manifest.recipe_names():
        for spec in manifest.recipe_bases(name):
            assert f"{name}: verl {spec.version}" in proc.stdout
            assert f"tree llm_rl/{name}/verl-{spec.version}/" in proc.stdout


def test_each_dockerfile_builds_the_recipes_default_base_on_its_image() -> None:
    import re

    for name in manifest.recipe_names():
        spec = manifest.load_recipe(name)
        text = (REPO / "docker" / f"Dockerfile.{name}").read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
        assert args["VERL_BASE"] == spec.default, f"Dockerfile.{name} builds {args['VERL_BASE']}"
        assert spec.image and args["BASE_IMAGE"] == spec.image, f"Dockerfile.{name}: {args['BASE_IMAGE']}"
        for other in manifest.recipe_bases(name):
            assert other.image and other.image_source, f"{name} base {other.version} names no image"
        # each other base's build line in the header: its VERL_BASE with the image recipe.toml names for it
        builds = re.findall(
            r"--build-arg VERL_BASE=(\S+) \\\n#\s+--build-arg BASE_IMAGE=(\S+)", text, re.MULTILINE
        )
        images = {spec.version: spec.image for spec in manifest.recipe_bases(name)}
        for base, image in builds:
            assert images.get(base) == image, f"Dockerfile.{name} builds verl {base} on {image}"
        if name == "qwen2_5":  # it documents every base (issue 45: 0.9.1 on CANN 9.1.0)
            assert {base for base, _ in builds} | {spec.default} == set(images), builds


def test_the_known_trees_file_is_current() -> None:
    from ascend_rl import patchdoc
    from ci_policy import get_artifact

    sdists = get_artifact("a base's verl sdist", patchdoc.base_sdists)
    want, missing = patchdoc.expected_trees(sdists)
    if missing:
        pytest.skip("; ".join(missing))
    assert trees.TREES_FILE.read_text(encoding="utf-8") == want, (
        "run: python -m ascend_rl patchdoc write --trees"
    )


def test_a_0_7_1_tree_given_to_the_0_6_0_series_is_named_and_what_it_already_carries(pristine_base) -> None:
    tree = pristine_base("0.7.1")
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", tree)
    assert proc.returncode == 1
    assert "is verl 0.7.1 (the PyPI sdist verl-0.7.1.tar.gz), a base of qwen2_5" in proc.stderr
    assert "pass --base 0.7.1" in proc.stderr
    forced = cli("status", "qwen2_5", "--base", "0.6.0", "--target", tree, "--force")
    rows = {
        ln.split()[1]: ln.split()[0]
        for ln in forced.stdout.splitlines()
        if ln.split()[1:2] and ln.split()[1].startswith("shared-")
    }
    # the fixes 0.7.1 took are named with the evidence the 0.7.1 base records
    assert rows["shared-0006"] == "carried" and "verl PR 4248" in forced.stdout
    assert rows["shared-0007"] == "carried" and "verl PR 4811" in forced.stdout
    status = cli("status", "qwen2_5", "--base", "0.7.1", "--target", tree)
    n = len(manifest.load_recipe("qwen2_5", "0.7.1").series)
    assert status.returncode == 0 and status.stdout.count("applicable") == n, status.stdout


def test_a_0_9_1_tree_given_to_the_0_7_1_series_is_named_and_what_it_already_carries(pristine_base) -> None:
    tree = pristine_base("0.9.1")
    proc = cli("status", "qwen2_5", "--base", "0.7.1", "--target", tree)
    assert proc.returncode == 1 and "pass --base 0.9.1" in proc.stderr
    assert "is verl 0.9.1 (the PyPI sdist verl-0.9.1.tar.gz), a base of qwen2_5" in proc.stderr
    forced = cli("status", "qwen2_5", "--base", "0.7.1", "--target", tree, "--force")
    rows = {
        ln.split()[1]: ln.split()[0]
        for ln in forced.stdout.splitlines()
        if ln.split()[1:2] and ln.split()[1].startswith("shared-")
    }
    # retired with the 0.9.1 lines recorded in recipe.toml; shared-0013's files moved (ported as shared-0014)
    assert rows["shared-0009"] == "carried" and "vllm_async_server.py:321-322" in forced.stdout
    assert rows["shared-0011"] == "carried" and "ray_trainer.py:531" in forced.stdout
    assert rows["shared-0013"] == "conflicting" and rows["shared-0012"] == "applicable"


def test_status_says_when_a_tree_of_the_right_version_differs_from_the_release(verl_tree: Path) -> None:
    clean = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    assert clean.returncode == 0 and "differ from verl 0.6.0" not in clean.stdout
    overlay.apply_series(manifest.load_recipe("qwen2_5", "0.6.0"), verl_tree, log=lambda m: None)
    tracking = verl_tree / "verl" / "utils" / "tracking.py"  # touched by shared-0007; edit outside its hunks
    tracking.write_text(tracking.read_text() + "\n# a local line\n")
    proc = cli("status", "qwen2_5", "--base", "0.6.0", "--target", verl_tree)
    n = len(manifest.load_recipe("qwen2_5", "0.6.0").series)
    assert proc.returncode == 0 and proc.stdout.count("  applied ") == n, proc.stdout
    assert "1 of the" in proc.stdout and "differ from verl 0.6.0" in proc.stdout
    assert "(first: verl/utils/tracking.py)" in proc.stdout
