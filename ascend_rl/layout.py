"""docs/layout.md's module list, generated from the tree: one line per module or script, from its docstring.

    python3 -m ascend_rl layout            # print the generated block
    python3 -m ascend_rl layout --write    # rewrite it in docs/layout.md (--dry-run: say whether it would change)
    python3 -m ascend_rl layout --check    # exit 1 when docs/layout.md is stale (the test suite runs the same)

The block sits between `<!-- layout:modules -->` and `<!-- layout:end -->`; the text around it is written by
hand. A module's line is the first line of its docstring; a shell script's, its first comment line after the
shebang. Materialised verl trees, virtual environments and test files (tests/**/test_*.py) are left out.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

from ascend_rl.errors import EXIT_OK, EXIT_REFUSED
from ascend_rl.paths import REPO

DOC = REPO / "docs" / "layout.md"
ROOTS = ("ascend_rl", "llm_rl", "scripts", "docker", "tests", ".ci")
BLOCK = re.compile(r"(<!-- layout:modules -->\n)(.*?)(<!-- layout:end -->)", re.S)


class LayoutError(Exception):
    """A file the layout cannot describe (no docstring, no comment), or a docs/layout.md without the block."""


def _skipped(rel: Path) -> bool:
    parts = rel.parts
    if any(p.startswith(("verl-", ".venv", "__pycache__", ".")) and p != ".ci" for p in parts):
        return True
    if any(
        p in ("model", "data", "checkpoints", "outputs", "merged", "MindSpeed", "verl") for p in parts[2:]
    ):
        return True  # a recipe's run-time folders (git-ignored)
    return parts[0] == "tests" and rel.name.startswith("test_")


def described_files(root: Path = REPO) -> list[Path]:
    """The modules and scripts the block lists, relative to `root`, in path order."""
    found = []
    for top in ROOTS:
        for path in sorted((root / top).rglob("*"), key=lambda p: (p.parent, p.name)):
            rel = path.relative_to(root)
            if path.is_file() and (path.suffix in (".py", ".sh") or top == ".ci") and not _skipped(rel):
                found.append(rel)
    return found


def _sentence(lines: list[str]) -> str:
    """The first sentence of a paragraph given as lines."""
    text = " ".join(line.strip() for line in lines if line.strip())
    for m in re.finditer(r"\.\s", text):
        if not re.search(r"\b(vs|e\.g|i\.e|etc)$", text[: m.start()]):
            return text[: m.start() + 1]
    return text.rstrip(":")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, or of a script's leading comment."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(text))
        except SyntaxError as exc:
            raise LayoutError(f"{path}: does not parse ({exc.msg}, line {exc.lineno})") from None
        if not doc:
            raise LayoutError(f"{path}: has no docstring; give it a one-line one that says what it is for")
        return _sentence(doc.strip().split("\n\n")[0].splitlines())
    comment: list[str] = []
    for line in text.splitlines()[1:] if text.startswith("#!") else text.splitlines():
        body = line.lstrip("#").strip()
        if not line.startswith("#") or (comment and not body):
            break
        if body and not body.startswith("shellcheck "):
            comment.append(body)
    if not comment:
        raise LayoutError(f"{path}: has no leading comment; start it with one line that says what it is for")
    return _sentence(comment)


def render(root: Path = REPO) -> str:
    """The generated block's body: one `- path: summary` line per file, grouped by folder."""
    lines, folder = [], None
    for rel in described_files(root):
        if rel.parent != folder:
            folder = rel.parent
            lines.append(f"\n**{folder}/**\n")
        lines.append(f"- `{rel.name}`: {_short(summary(root / rel))}")
    return "\n".join(lines).lstrip("\n") + "\n"


def regenerated(doc: Path = DOC, root: Path = REPO) -> tuple[str, str]:
    """(current text, text with the block regenerated)."""
    text = doc.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise LayoutError(f"{doc}: no '<!-- layout:modules -->' ... '<!-- layout:end -->' block to fill")
    body = render(root)
    return text, BLOCK.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl layout", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the block in docs/layout.md")
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/layout.md's block is stale")
    parser.add_argument("--dry-run", action="store_true", help="with --write: say whether it would change")
    args = parser.parse_args(argv)
    try:
        if not (args.write or args.check):
            sys.stdout.write(render())
            return EXIT_OK
        current, fresh = regenerated()
    except LayoutError as exc:
        print(f"layout: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if current == fresh:
        print(f"layout: {DOC.relative_to(REPO)} is current")
        return EXIT_OK
    if args.check or args.dry_run:
        print(
            f"layout: {DOC.relative_to(REPO)} is stale; run: python3 -m ascend_rl layout --write",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    tmp = DOC.with_name(DOC.name + ".tmp")
    tmp.write_text(fresh, encoding="utf-8")
    tmp.replace(DOC)
    print(f"layout: rewrote {DOC.relative_to(REPO)}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
