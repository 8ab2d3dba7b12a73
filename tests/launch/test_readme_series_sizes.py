"""A series size a document states is the manifest's (issue 36, item 10).

The READMEs said "4 patches" for qwen2_5 on verl 0.7.1 and "10" on 0.6.0 after the manifests had grown to 5 and
11. Every statement of the form "<number> [up to three words] patches" in the READMEs and docs/ is a series size
here: it must name the base it counts (the version on its line: a table row's base, or in the phrase itself), and
its number, and the patch ids listed after it (`5 patches: \\`shared-0004\\`, ...`), must be that base's series in
recipe.toml. A number that cannot be tied to one series fails too: drop it, or say which series it counts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ascend_rl import manifest
from ascend_rl.patchset import patch_id

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        *REPO.glob("llm_rl/*/README.md"),
        *REPO.glob("llm_rl/*/demo/README.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("patches/README.md"),
        *REPO.glob("patches/*/README.md"),
    }
)
WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".split()
)
NUMBER = rf"\d+|{'|'.join(WORDS)}"
# up to three words between the number and "patches", none of them a bare number ("5 of the 11 patches" states 11)
STATEMENT = re.compile(
    rf"(?<![\w.])(?P<n>{NUMBER})\s+(?P<between>(?:(?!(?:{NUMBER})\s)[\w.`'*-]+\s+){{0,3}}?)patches\b"
    r"(?P<ids>:\s*`[a-z]+-\d{4}`(?:(?:,\s*|\s+and\s+)`[a-z]+-\d{4}`)*)?",
    re.IGNORECASE,
)
VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")


def _series(recipe: str) -> dict[str, list[str]]:
    return {r.version: [patch_id(p) for p in r.series] for r in manifest.recipe_bases(recipe)}


SERIES = {recipe: _series(recipe) for recipe in manifest.recipe_names()}


def statements(text: str, rel: Path) -> list[tuple[int, str, str | None, str | None, int, list[str] | None]]:
    """(line, text, recipe, base, stated size, listed ids) for each series size a document (`rel`, its path in the
    repository: a recipe's folder names the recipe) states."""
    found = []
    for m in STATEMENT.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        line_no = text.count("\n", 0, m.start()) + 1
        line = text[start : text.find("\n", m.start())]
        n = m.group("n").lower()
        size = int(n) if n.isdigit() else WORDS.index(n) + 1
        if rel.parts[0] == "llm_rl":
            recipe = rel.parts[1]
        elif rel.parts[0] == "docs" and rel.name.split("-")[0] in SERIES:
            recipe = rel.name.split("-")[0]  # a recipe's evidence moved out of its README: docs/<recipe>-*.md
        else:
            named = [r for r in SERIES if r in line]
            recipe = named[0] if len(named) == 1 else None
        bases = set(SERIES.get(recipe, {}))
        inside = [v for v in VERSION.findall(m.group("between")) if v in bases]
        before = [v for v in VERSION.findall(text[start : m.start()]) if v in bases]
        base = inside[0] if inside else (before[-1] if before else None)
        ids = re.findall(r"`([a-z]+-\d{4})`", m.group("ids")) if m.group("ids") else None
        found.append((line_no, m.group(0).replace("\n", " "), recipe, base, size, ids))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_series_size_a_document_states_is_the_manifests(doc):
    wrong = []
    for line, said, recipe, base, size, ids in statements(
        doc.read_text(encoding="utf-8"), doc.relative_to(REPO)
    ):
        where = f"{doc.relative_to(REPO)}:{line}: {said!r}"
        if recipe is None or base is None:
            wrong.append(f"{where} states a series size without naming its recipe and base on that line")
            continue
        series = SERIES[recipe][base]
        if size != len(series):
            wrong.append(f"{where}: {recipe} on verl {base} has {len(series)} patches in recipe.toml")
        if ids is not None and ids != series:
            wrong.append(f"{where}: {recipe} on verl {base} is {', '.join(series)}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_the_statements_it_is_for():
    """A table row's size and ids, a base named in the phrase, a number that counts something else (K of the N
    patches: N is the series size), a size no base is named for."""
    text = (
        "| **0.7.1** (default) | server mode | 4 patches: `shared-0004`, `shared-0009` | image |\n"
        "| 0.6.0 | sync | 11 patches, below |\n"
        "it is no base: 5 of the 10 shared 0.6.0 patches conflict on it; three patches more\n"
    )
    found = [
        (line, recipe, base, size, ids)
        for line, _, recipe, base, size, ids in statements(text, Path("llm_rl/qwen2_5/README.md"))
    ]
    assert found == [
        (1, "qwen2_5", "0.7.1", 4, ["shared-0004", "shared-0009"]),
        (2, "qwen2_5", "0.6.0", 11, None),
        (3, "qwen2_5", "0.6.0", 10, None),
        (3, "qwen2_5", "0.6.0", 3, None),
    ]
    assert statements("the series has 5 patches", Path("docs/x.md"))[0][2:4] == (None, None)
    assert statements("| 0.6.0 | sync | 11 patches, below |", Path("docs/qwen2_5-evidence.md"))[0][2:4] == (
        "qwen2_5",
        "0.6.0",
    )
