"""README.md and the recipe READMEs read as guides (issue 61, item 7).

A new user reaches, within README.md's first screen (40 lines): the two commands (a recipe's launcher, and
`make test` / `make demo`), what they cost (Python version, disk, time) and what the project has and has not run on
(CPU only, no NPU run). README.md stays within 180 lines and quotes no internal issue numbers; each recipe README
starts with how to run it and stays within 300 lines, its evidence and history in docs/ (linked from it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RECIPE_READMES = sorted(REPO.glob("llm_rl/*/README.md"))
SCREEN = 40
ISSUE_REF = re.compile(r"(?<![\w/&])#\d+\b|\bissues?\s+#?\d+\b", re.IGNORECASE)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_the_readme_is_at_most_180_lines():
    assert len(_lines(README)) <= 180, f"README.md has {len(_lines(README))} lines"


@pytest.mark.parametrize("readme", RECIPE_READMES, ids=lambda p: p.parent.name)
def test_each_recipe_readme_is_at_most_300_lines(readme):
    assert len(_lines(readme)) <= 300, f"{readme.relative_to(REPO)} has {len(_lines(readme))} lines"


def test_the_first_screen_has_the_commands_the_costs_and_what_it_ran_on():
    screen = "\n".join(_lines(README)[:SCREEN])
    missing = [
        what
        for what, pattern in {
            "a recipe's launcher": r"bash llm_rl/\w+/run_\w+\.sh",
            "make test or make demo": r"make (test|demo)\b",
            "the Python version": r"Python\s+3\.\d+",
            "the disk": r"\d+(\.\d+)? GB",
            "the time": r"\d+ (min|s)\b",
            "CPU only": r"\bCPU\b",
            "no NPU run": r"\b([Nn]o|not)\b[^.]{0,40}\bNPU",
        }.items()
        if not re.search(pattern, screen)
    ]
    assert not missing, f"README.md's first {SCREEN} lines lack: {', '.join(missing)}"


def test_the_readme_quotes_no_internal_issue_numbers():
    found = [f"{n}: {line.strip()}" for n, line in enumerate(_lines(README), 1) if ISSUE_REF.search(line)]
    assert not found, "\n".join(found)


def test_the_issue_reference_check_finds_what_it_is_for():
    assert ISSUE_REF.search("the default since issue 46") and ISSUE_REF.search("see #61")
    assert ISSUE_REF.search("(issues 45 and 46)")
    assert not ISSUE_REF.search("[link](https://example.org/x#section) verl PR 4480, shared-0012")


@pytest.mark.parametrize("readme", RECIPE_READMES, ids=lambda p: p.parent.name)
def test_each_recipe_readme_starts_with_how_to_run_it_and_links_its_evidence(readme):
    text = readme.read_text(encoding="utf-8")
    first = re.search(r"^## (.+)$", text, re.M)
    assert first and re.match(r"(Run it|How to run)", first.group(1)), (
        f"{readme.relative_to(REPO)}'s first section is {first.group(1) if first else None!r}, not how to run it"
    )
    evidence = f"docs/{readme.parent.name}-evidence.md"
    assert (REPO / evidence).is_file(), f"{evidence} is missing"
    assert f"../../{evidence}" in text, f"{readme.relative_to(REPO)} does not link {evidence}"
