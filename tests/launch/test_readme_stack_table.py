"""The README's table of verl bases and their stacks is the manifests' and the constraints files' (issue 45).

Every cell but "what it is for" is a fact a file here records: the versions are the pins of the base's constraints
file (recipe.toml's `constraints`, else constraints.txt), the image is the Qwen recipe's for the base (the DeepSeek
recipe's is its A3 flavour), CANN is that image's tag, and the recipes column names each recipe that has the base,
marked where it is that recipe's default. A row per base of any recipe, no more. File reads only: fast.
"""

from __future__ import annotations

import re
from pathlib import Path

from ascend_rl import manifest
from ascend_rl import stack as check_stack

REPO = Path(__file__).resolve().parents[2]
HEADER = "| verl base |"
LABELS = {"qwen2_5": "Qwen", "deepseek_r1": "DeepSeek"}
# the recipe whose image and pins a row shows: the Qwen recipe (Atlas A2) has every base
SHOWN = "qwen2_5"


def table(text: str) -> list[dict[str, str]]:
    """The rows of the README's base table, each a column -> cell dict."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    names = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def expected_row(base: str) -> dict[str, str]:
    """The cells the files say a base's row holds (all but "what it is for")."""
    spec = manifest.load_recipe(SHOWN, base)
    constraints = check_stack.base_constraints(SHOWN, base)
    pins = {
        re.sub(r"[-_.]+", "-", name).lower(): version for name, version in check_stack.read_pins(constraints)
    }
    cann = re.search(r"/cann:([^-]+)-", spec.image)
    recipes = []
    for name in LABELS:  # the README's order
        ds = manifest.load_recipe(name)
        if base in ds.bases:
            recipes.append(LABELS[name] + (" (default)" if ds.default == base else ""))
    return {
        "verl base": base,
        "vLLM": pins["vllm"],
        "vllm-ascend": pins["vllm-ascend"],
        "CANN": cann.group(1) if cann else "?",
        "torch / torch_npu": f"{pins['torch']} / {pins['torch-npu']}",
        "transformers": pins["transformers"],
        "pins": f"`{constraints.name}`",
        "image": f"`{spec.image}`",
        "recipes": ", ".join(recipes),
    }


def table_errors(text: str) -> list[str]:
    """Each cell of the table that disagrees with the files, and each base missing from it or extra."""
    rows = table(text)
    bases = {base for name in manifest.recipe_names() for base in manifest.load_recipe(name).bases}
    errors = [f"no row for verl {base}" for base in sorted(bases - {row["verl base"] for row in rows})]
    for row in rows:
        if row["verl base"] not in bases:
            errors.append(f"a row for verl {row['verl base']}, which no recipe has")
            continue
        if not row.get("what it is for"):
            errors.append(f"verl {row['verl base']}: says nothing in 'what it is for'")
        for column, want in expected_row(row["verl base"]).items():
            if row.get(column) != want:
                errors.append(
                    f"verl {row['verl base']}, {column}: {row.get(column)!r}, the files say {want!r}"
                )
    return errors


def test_the_readme_base_table_is_the_manifests_and_constraints():
    assert set(LABELS) == set(manifest.recipe_names()), "a new recipe: give it a label and its bases a row"
    assert table_errors((REPO / "README.md").read_text(encoding="utf-8")) == []


def test_a_drifted_or_missing_cell_is_found():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| 0.9.1 |"))
    drifted = text.replace(row, row.replace("| 0.23.0.post1 |", "| 0.23.0 |").replace("py3.12", "py3.11"))
    assert table_errors(drifted) == [
        "verl 0.9.1, vllm-ascend: '0.23.0', the files say '0.23.0.post1'",
        "verl 0.9.1, image: '`quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.11`', the files say "
        "'`quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12`'",
    ]
    assert table_errors(text.replace(row + "\n", "")) == ["no row for verl 0.9.1"]
    # the Qwen default (verl 0.9.1) shown on no row
    moved = text.replace(row, row.replace("| Qwen (default)", "| Qwen"))
    shown = next(cell.strip() for cell in row.strip("|").split("|")[::-1] if cell.strip())
    assert table_errors(moved) == [
        f"verl 0.9.1, recipes: '{shown.replace('Qwen (default)', 'Qwen')}', the files say '{shown}'"
    ]


def test_the_deepseek_images_are_the_a3_flavour_of_the_shown_ones():
    """What the sentence above the table says: the same CANN release, '-a3-' where the A2 image says '-910b-'."""
    for spec in manifest.recipe_bases("deepseek_r1"):
        shown = manifest.load_recipe(SHOWN, spec.version).image
        assert spec.image.replace("-a3-", "-910b-") == shown, (spec.version, spec.image, shown)
