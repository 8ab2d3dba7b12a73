"""docs/layout.md's module list is generated from the tree and fails the suite when stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import layout
from ascend_rl.paths import REPO


def test_docs_layout_is_current():
    current, fresh = layout.regenerated()
    assert current == fresh, "docs/layout.md is stale; run: python3 -m ascend_rl layout --write"


def test_every_module_of_the_library_and_the_recipes_has_its_line():
    text = (REPO / "docs" / "layout.md").read_text()
    for rel in layout.described_files():
        assert f"- `{rel.name}`:" in text, rel
    names = {str(rel) for rel in layout.described_files()}
    assert "ascend_rl/overlay.py" in names and "llm_rl/deepseek_r1/verl_modules/explicit_offload.py" in names
    assert not any("/test_" in n or "verl-" in n for n in names)


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "ascend_rl").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "ascend_rl" / "a.py").write_text('"""Does a. More words here."""\n')
    (root / "scripts" / "s.sh").write_text(
        "#!/usr/bin/env bash\n# shellcheck shell=bash\n# Runs s, e.g. twice.\n"
    )
    (root / "docs").mkdir()
    (root / "docs" / "layout.md").write_text(
        "# L\n\n<!-- layout:modules -->\nold\n<!-- layout:end -->\ntail\n"
    )
    return root


def test_a_new_module_makes_the_page_stale_and_write_mends_it(tmp_path):
    root = _tree(tmp_path)
    doc = root / "docs" / "layout.md"
    current, fresh = layout.regenerated(doc, root)
    assert current != fresh
    assert "- `a.py`: Does a." in fresh and "More words" not in fresh
    assert "- `s.sh`: Runs s, e.g. twice." in fresh and fresh.endswith("<!-- layout:end -->\ntail\n")
    doc.write_text(fresh)
    assert layout.regenerated(doc, root)[0] == layout.regenerated(doc, root)[1]
    (root / "ascend_rl" / "b.py").write_text('"""Does b."""\n')
    assert layout.regenerated(doc, root)[0] != layout.regenerated(doc, root)[1]


def test_a_module_without_a_docstring_is_named(tmp_path):
    root = _tree(tmp_path)
    (root / "ascend_rl" / "bare.py").write_text("X = 1\n")
    with pytest.raises(layout.LayoutError, match="bare.py: has no docstring"):
        layout.render(root)


def test_the_command_checks_and_says_what_to_run():
    out = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "layout", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "is current" in out.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "ascend_rl", "layout", "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0 and "--check" in helped.stdout
