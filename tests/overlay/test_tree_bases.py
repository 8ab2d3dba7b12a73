"""A tree that is another base of the recipe is patched on that base, said in one line; --base still decides;
a tree the tool cannot place is refused as before; a revert that would leave another series' patches on a
bare base is refused. Each test runs the overlay command as a user types it, on the real sdists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_edited_trees import cli, tree_bytes

from ascend_rl import manifest


def told(name: str, base: str, how: str = "") -> str:
    return f"overlay: the tree is verl {base}{how}, a base of {name}: using its series"


# Each recipe on its base that is not the default: the tree a user holds, given without --base.
OTHER_BASES = [
    (name, base)
    for name in manifest.recipe_names()
    for base in manifest.load_recipe(name).bases
    if base != manifest.load_recipe(name).default
]


def test_each_recipe_has_a_base_besides_its_default() -> None:
    assert {name for name, _ in OTHER_BASES} == set(manifest.recipe_names())
    assert ("qwen2_5", "0.6.0") in OTHER_BASES and ("deepseek_r1", "0.7.1") in OTHER_BASES


@pytest.mark.parametrize("name,base", OTHER_BASES, ids=[f"{n}@{b}" for n, b in OTHER_BASES])
def test_a_tree_of_another_base_is_patched_on_that_base(name, base, base_tree, pristine_base) -> None:
    tree = base_tree(base)
    n = len(manifest.load_recipe(name, base).series)
    status = cli("status", name, "--target", tree)
    assert status.returncode == 0 and status.stderr.splitlines() == [told(name, base)], status.stderr
    assert f"{name}: {n} patches on " in status.stdout and status.stdout.count(" applicable ") == n

    apply = cli("apply", name, "--target", tree)
    assert apply.returncode == 0 and apply.stderr.splitlines() == [told(name, base)], apply.stderr
    assert f"{name}: applied {n} of {n} patches on " in apply.stdout

    again = cli("status", name, "--target", tree)
    assert again.returncode == 0 and again.stdout.count(" applied ") == n, again.stdout

    revert = cli("revert", name, "--target", tree)
    assert revert.returncode == 0 and revert.stderr.splitlines() == [told(name, base)], revert.stderr
    assert f"{name}: reverted {n} of {n} patches" in revert.stdout
    assert tree_bytes(tree) == tree_bytes(pristine_base(base))


def test_revert_of_a_tree_patched_with_base_needs_no_base(base_tree, pristine_base) -> None:
    tree = base_tree("0.6.0")
    apply = cli("apply", "qwen2_5", "--base", "0.6.0", "--target", tree)
    assert apply.returncode == 0 and apply.stderr == "", apply.stderr  # --base given: nothing to say
    revert = cli("revert", "qwen2_5", "--target", tree)
    assert revert.returncode == 0 and revert.stderr.splitlines() == [told("qwen2_5", "0.6.0")], revert.stderr
    n = len(manifest.load_recipe("qwen2_5", "0.6.0").series)
    assert f"qwen2_5: reverted {n} of {n} patches" in revert.stdout
    assert tree_bytes(tree) == tree_bytes(pristine_base("0.6.0"))


def site_packages(pristine: Path, dest: Path, *versions: str) -> Path:
    """A site-packages folder as pip leaves it: verl/ and one dist-info per version given."""
    shutil.copytree(pristine / "verl", dest / "verl")
    for version in versions:
        info = dest / f"verl-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {version}\n")
    return dest


@pytest.mark.parametrize("base", ["0.6.0", "0.7.1", "0.9.1"])
def test_a_pip_installed_verl_is_patched_on_its_version(base, tmp_path, pristine_base) -> None:
    site = site_packages(pristine_base(base), tmp_path / "lib" / "python3.11" / "site-packages", base)
    before = tree_bytes(site)
    proc = cli("apply", "qwen2_5", "--target", site)
    assert proc.returncode == 0, proc.stderr
    # a base other than the default is named on stderr; the default (0.9.1) goes on without a word
    said = (
        [] if base == manifest.load_recipe("qwen2_5").default else [told("qwen2_5", base, " (pip-installed)")]
    )
    assert proc.stderr.splitlines() == said
    n = len(manifest.load_recipe("qwen2_5", base).series)
    assert f"applied {n} of {n} patches" in proc.stdout and "drops the patches" in proc.stdout
    revert = cli("revert", "qwen2_5", "--target", site)
    assert revert.returncode == 0 and f"reverted {n} of {n} patches" in revert.stdout, revert.stderr
    assert tree_bytes(site) == before


def test_a_pip_installed_verl_of_two_versions_is_refused(tmp_path, pristine_base) -> None:
    site = site_packages(pristine_base("0.6.0"), tmp_path / "site-packages", "0.6.0", "0.7.1")
    before = tree_bytes(site)
    for verb in ("status", "apply", "revert"):
        proc = cli(verb, "qwen2_5", "--target", site)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1 and proc.stdout == "", proc.stderr
        assert "reads verl 0.6.0 (verl/version/version)" in err[0]
        assert "verl-0.6.0.dist-info, verl-0.7.1.dist-info" in err[0] and "pass --base" in err[0]
    # --base decides: the tree's version file is 0.6.0, so the 0.6.0 series goes on
    assert cli("status", "qwen2_5", "--base", "0.6.0", "--target", site).returncode == 0
    assert tree_bytes(site) == before


def test_base_still_decides_when_given(base_tree) -> None:
    tree = base_tree("0.6.0")
    before = tree_bytes(tree)
    for verb in ("status", "apply", "revert"):
        proc = cli(verb, "qwen2_5", "--base", "0.7.1", "--target", tree)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1, proc.stderr
        assert "a base of qwen2_5, which is on 0.7.1 here: pass --base 0.6.0" in err[0]
    assert tree_bytes(tree) == before


@pytest.mark.parametrize("version", ["0.6.1", "0.5.0.dev"])
def test_a_tree_it_cannot_place_is_refused_as_before(version, base_tree) -> None:
    tree = base_tree("0.6.0")
    (tree / "verl" / "version" / "version").write_text(version + "\n")
    before = tree_bytes(tree)
    for verb in ("status", "apply", "revert"):
        proc = cli(verb, "qwen2_5", "--target", tree)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1 and "using its series" not in proc.stderr, proc.stderr
        assert (
            f"is verl {version}" in err[0]
            and "not a base of qwen2_5 (its bases: 0.6.0, 0.7.1, 0.9.1)" in err[0]
        )
    assert tree_bytes(tree) == before


@pytest.mark.parametrize(
    "base,under,over,own",
    [("0.7.1", "qwen2_5", "deepseek_r1", 11), ("0.6.0", "deepseek_r1", "qwen2_5", 3)],
    ids=["qwen2_5-under-deepseek_r1@0.7.1", "deepseek_r1-under-qwen2_5@0.6.0"],
)
def test_revert_refuses_to_leave_another_series_on_a_bare_base(base, under, over, own, base_tree) -> None:
    """On 0.7.1 DeepSeek's series stacks 11 patches on the 5 it shares with Qwen's; on 0.6.0 Qwen's has
    3 (shared-0005, -0006, -0008) over the ones it shares with DeepSeek's. Reverting the one beneath
    would take the shared patches from under them: refused, naming the series on top."""
    tree = base_tree(base)
    assert cli("apply", over, "--base", base, "--target", tree).returncode == 0
    before = tree_bytes(tree)
    for extra in ([], ["--dry-run"]):
        proc = cli("revert", under, "--base", base, "--target", tree, *extra)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1 and "reverted" not in proc.stdout, (
            proc.stderr + proc.stdout
        )
        assert f"this tree carries {over}'s series on top of {under}'s: {own} patches of its own" in err[0]
        assert f"revert {over} instead (python3 -m ascend_rl overlay revert {over}" in err[0]
        assert err[0].endswith("; nothing was changed")
        assert tree_bytes(tree) == before
    # The series on top comes off whole, and then the one beneath has nothing left to take off.
    assert cli("revert", over, "--base", base, "--target", tree).returncode == 0
    done = cli("revert", under, "--base", base, "--target", tree)
    assert done.returncode == 0 and "nothing to revert" in done.stdout, done.stdout + done.stderr


def test_revert_refuses_to_leave_an_overlay_on_a_bare_base(base_tree, pristine_base) -> None:
    # verl 0.7.1, named (--base: no "using its series" line before the error). On 0.9.1 cpu-0015 edits the lines
    # shared-0017 adds, so the same revert is refused as an edit of shared-0017 instead (nothing changed either way).
    tree = base_tree("0.7.1")
    q = ("qwen2_5", "--base", "0.7.1")
    assert cli("apply", *q, "--with", "cpu", "--target", tree).returncode == 0
    before = tree_bytes(tree)
    proc = cli("revert", *q, "--target", tree)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1, proc.stderr
    assert "this tree carries qwen2_5+cpu's series on top of qwen2_5's" in err[0]
    assert "(python3 -m ascend_rl overlay revert qwen2_5 --with cpu --base 0.7.1 --target " in err[0]
    assert tree_bytes(tree) == before
    assert cli("revert", *q, "--with", "cpu", "--target", tree).returncode == 0
    assert tree_bytes(tree) == tree_bytes(pristine_base("0.7.1"))
