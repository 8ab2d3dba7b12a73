"""Every recipe's real patch series on each of its verl bases' real sdist: applies, re-applies as a no-op,
compiles, reverts byte-identically; every patch is documented and none is orphaned."""

from __future__ import annotations

import py_compile

import pytest
from test_overlay import tree_hash

from ascend_rl import manifest, overlay, patchdoc

RECIPES = overlay.recipe_names()
# Every series the repository applies: each recipe's on each of its bases, and the CPU overlay on top of
# each where the overlay has that base (what tests, make e2e and the launchers' CPU profiles use).
SERIES = [
    (name, base, extra)
    for name in RECIPES
    for base in overlay.load_recipe(name).bases
    for extra in (None, "cpu")
    if extra is None or base in manifest.overlay_series(manifest.overlay_manifests()[extra])
]
IDS = [f"{n}@{b}" + (f"+{e}" if e else "") for n, b, e in SERIES]


def _series(name: str, base: str, with_overlay: str | None):
    recipe = overlay.load_recipe(name, base)
    return overlay.with_overlay(recipe, with_overlay) if with_overlay else recipe


def test_both_recipes_have_manifests():
    assert {"qwen2_5", "deepseek_r1"} <= set(RECIPES)


PINS = {
    "0.6.0": (
        "v0.6.0",
        "ddd86f527a4af75095e4677b02b5aa272913a088",
        "806ec5212f42c6a39143754ce86d2df28ab1373762d35846ca7b022bcb7b1402",
    ),
    "0.7.1": ("v0.7.1", "", "0c208c03d5dc48f8262192355f403d74dae6574daebe68f2c4d28f021c4248d0"),
    "0.9.1": ("v0.9.1", "", "3e03d8816b2546b2c5580705671b8d0bb3f79b8364e7b5c56dbfc1245536ba22"),
}


@pytest.mark.parametrize("name", RECIPES)
def test_manifest_pins_each_base(name):
    for recipe in manifest.recipe_bases(name):
        assert recipe.project == "verl" and recipe.version in PINS
        assert (recipe.tag, recipe.commit, recipe.sdist_sha256) == PINS[recipe.version]
        assert recipe.sdist == f"verl-{recipe.version}.tar.gz"
        assert recipe.series, f"{name} has an empty patch series on {recipe.version}"


@pytest.mark.parametrize("name", RECIPES)
def test_every_patch_has_a_header_and_a_table_row(name, repo_root):
    for recipe in manifest.recipe_bases(name):
        readme = (recipe.folder / "README.md").read_text()
        shared = (repo_root / "patches" / "README.md").read_text()
        for path in recipe.series:
            assert patchdoc.check_header(patchdoc.read_header(path)) == []
            assert recipe.version in patchdoc.header_bases(patchdoc.read_header(path))
            table = shared if path.is_relative_to(repo_root / "patches") else readme
            assert path.name in table or path.stem in table, f"{path.name} has no row in its patch table"
            assert path.name in readme or path.stem in readme, f"{path.name} missing from {name}/README.md"


def test_no_orphan_patches(repo_root):
    listed = {p for name, base, extra in SERIES for p in _series(name, base, extra).series}
    on_disk = set(repo_root.glob("patches/**/*.patch")) | set(repo_root.glob("llm_rl/*/patches/*.patch"))
    assert on_disk - listed == set(), "patch files no series uses"


@pytest.mark.parametrize("name,base,extra", SERIES, ids=IDS)
def test_series_round_trip_on_the_sdist(name, base, extra, base_tree, pristine_base):
    recipe = _series(name, base, extra)
    verl_tree = base_tree(base)
    pristine = tree_hash(verl_tree)
    assert [s.state for s in overlay.series_status(recipe, verl_tree)] == ["applicable"] * len(recipe.series)

    overlay.apply_series(recipe, verl_tree)
    assert [s.state for s in overlay.series_status(recipe, verl_tree)] == ["applied"] * len(recipe.series)
    patched = tree_hash(verl_tree)
    assert patched != pristine

    touched = {fp.path for path in recipe.series for fp in overlay.patchset.parse(path).files}
    for rel in sorted(touched):
        if rel.endswith(".py") and (verl_tree / rel).exists():
            py_compile.compile(
                str(verl_tree / rel), doraise=True, cfile=str(verl_tree / (rel + ".pyc-check"))
            )
            (verl_tree / (rel + ".pyc-check")).unlink()

    states = overlay.apply_series(recipe, verl_tree)
    assert all(s.state == "applied" for s in states)
    assert tree_hash(verl_tree) == patched, "a second apply must change nothing"

    overlay.revert_series(recipe, verl_tree)
    assert tree_hash(verl_tree) == tree_hash(pristine_base(base)) == pristine


def test_cpu_overlay_patches_are_documented_and_never_in_a_recipe(repo_root):
    cpu = overlay.with_overlay(overlay.load_recipe("qwen2_5", "0.6.0"), "cpu")
    own = [p for p in cpu.series if p.is_relative_to(repo_root / "patches" / "cpu")]
    assert own, "the CPU overlay lists no patch"
    table = (repo_root / "patches" / "cpu" / "README.md").read_text()
    for path in own:
        assert patchdoc.check_header(patchdoc.read_header(path)) == []
        assert path.name in table, f"{path.name} has no row in patches/cpu/README.md"
    for name in RECIPES:
        for recipe in manifest.recipe_bases(name):
            assert not set(own) & set(recipe.series), f"{name} lists a CPU-only patch on {recipe.version}"
