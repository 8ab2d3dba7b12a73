"""One math-verify everywhere (issue 36, item 7).

The reward is judged by math_verify, and its verdicts change between releases (0.3.3 takes \\text{Tuesday} for
\\text{Monday}; 0.9.0 does not).  So the release the tools, the reward's install line and the README name must be
the one every environment installs: requirements.txt (the tools, the dev environment), requirements-e2e.lock
(make e2e, make demo) and any other requirement or constraint file that pins it, together with the packages
math_verify itself pins (latex2sympy2_extended, and what that needs).  File reads only: fast.
"""

from __future__ import annotations

import re
from collections import defaultdict
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
REWARD = ROOT / "llm_rl" / "qwen2_5" / "new_math_reward.py"
READMES = (
    ROOT / "README.md",
    ROOT / "llm_rl" / "qwen2_5" / "README.md",
    *sorted(ROOT.glob("docs/qwen2_5-*.md")),
)
# math_verify and what it runs on: one version of each wherever it is pinned
MATH_STACK = ("math-verify", "latex2sympy2-extended", "antlr4-python3-runtime", "sympy")
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_files(root: Path = ROOT) -> list[Path]:
    """Every file pip reads requirements or constraints from here."""
    files = [*sorted(root.glob("requirements*.txt")), *sorted(root.glob("requirements*.lock"))]
    return files + sorted(
        root.glob("constraints*.txt")
    )  # constraints.txt and each base's own (constraints-0.9.1.txt)


def pins(path: Path) -> dict[str, str]:
    """name -> version for each ``name==version`` line of a requirement file."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _PIN_RE.match(line.strip())
        if m is not None:
            found[canonical(m.group(1))] = m.group(2)
    return found


def disagreements(files: list[Path], names: tuple[str, ...] = MATH_STACK) -> dict[str, dict[str, str]]:
    """The packages of names pinned to different versions in different files: name -> {file: version}."""
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    for path in files:
        for name, version in pins(path).items():
            if name in names:
                seen[name][path.name] = version
    return {name: where for name, where in seen.items() if len(set(where.values())) > 1}


def pinned_math_verify() -> str:
    return pins(ROOT / "requirements.txt")["math-verify"]


def test_the_math_stack_is_pinned_alike_in_every_requirement_file():
    files = requirement_files()
    where = {p.name for p in files if "math-verify" in pins(p)}
    assert {"requirements.txt", "requirements-e2e.lock"} <= where, where
    assert disagreements(files) == {}, "pin math_verify and its stack to one version in every file"


def test_a_disagreement_is_found(tmp_path):
    """The check above fails on two files that pin math-verify differently (as 0.3.3 / 0.9.0 did)."""
    (tmp_path / "requirements.txt").write_text("# tools\nmath-verify==0.9.0\nlatex2sympy2_extended==1.11.0\n")
    (tmp_path / "requirements-e2e.lock").write_text("Math_Verify==0.3.3\nlatex2sympy2-extended==1.11.0\n")
    (tmp_path / "constraints.txt").write_text("sympy==9.9.9\n")
    assert disagreements(requirement_files(tmp_path)) == {
        "math-verify": {"requirements.txt": "0.9.0", "requirements-e2e.lock": "0.3.3"}
    }


def test_the_reward_and_the_readmes_name_the_pinned_release():
    """The reward's install line (MathVerifyUnavailable) and every ``math-verify==`` in the READMEs."""
    version = pinned_math_verify()
    constant = re.search(r'^MATH_VERIFY_REQUIREMENT = "([^"]+)"', REWARD.read_text(encoding="utf-8"), re.M)
    assert constant is not None and constant.group(1) == f"math-verify=={version}"
    named = {
        (readme.name, m.group(1))
        for readme in READMES
        for m in re.finditer(r"math-verify==([0-9][^\s`'\")]*)", readme.read_text(encoding="utf-8"))
    }
    assert named and {v for _, v in named} == {version}, named


def _own_requirements(name: str) -> list[Requirement]:
    """A distribution's unconditional requirements, from its installed METADATA."""
    return [
        Requirement(r) for r in metadata.requires(name) or [] if "extra ==" not in r and "extra==" not in r
    ]


def test_the_pins_meet_math_verifys_own_requirements():
    """math-verify 0.9.0 pins latex2sympy2_extended==1.11.0, which wants antlr4 4.9.3-4.13.2 and sympy."""
    version = pinned_math_verify()
    assert metadata.version("math-verify") == version, (
        "the dev environment is not built from requirements.txt"
    )
    stack = {
        path.name: pins(path)
        for path in requirement_files()
        if any(name in pins(path) for name in MATH_STACK)
    }
    unmet = []
    for dist in ("math-verify", "latex2sympy2_extended"):
        for req in _own_requirements(dist):
            for file, pinned in stack.items():
                got = pinned.get(canonical(req.name))
                if got is not None and got not in req.specifier:
                    unmet.append(f"{file}: {req.name}=={got}, but {dist} requires {req}")
    assert unmet == []


@pytest.mark.parametrize("file", ["requirements.txt", "requirements-e2e.lock", "requirements-e2e-091.lock"])
def test_each_environment_pins_what_math_verify_pins(file):
    """latex2sympy2_extended is pinned beside math-verify, to the release math-verify requires."""
    pinned = pins(ROOT / file)
    wanted = {canonical(r.name): r for r in _own_requirements("math-verify")}
    assert "latex2sympy2-extended" in wanted
    assert pinned.get("latex2sympy2-extended") in wanted["latex2sympy2-extended"].specifier, pinned.get(
        "latex2sympy2-extended"
    )
