"""Imports go one way: the library (ascend_rl/ outside ascend_rl/harness/) imports neither the CPU proof rig
(ascend_rl.harness) nor the recipes (llm_rl), and a recipe (llm_rl/, less its materialised verl trees) does not
import the proof rig. Read from the source with ast, so a module nothing imports is checked too."""

from __future__ import annotations

import ast
from pathlib import Path

from ascend_rl import layout
from ascend_rl.paths import REPO

HARNESS, RECIPES = "ascend_rl.harness", "llm_rl"


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_of(rel: Path) -> list[str]:
    parts = list(rel.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(path: Path, rel: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in a file: `import a.b`, `from a import b` (as a.b: b may be a module),
    relative imports resolved against the file's package, and importlib.import_module / __import__ of a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(rel))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _module_of(rel)
                package = package[: len(package) - node.level + (rel.name == "__init__.py")]
                base = ".".join(package + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def refused(root: Path = REPO) -> list[tuple[str, int, str, str]]:
    """(file, line, module, rule) for every import that goes the wrong way."""
    out = []
    for rel in layout.described_files(root):
        if rel.suffix != ".py" or rel.parts[0] not in ("ascend_rl", RECIPES):
            continue
        if rel.parts[0] == RECIPES:
            rules = ((HARNESS, "a recipe imports the proof rig"),)
        elif rel.parts[:2] == ("ascend_rl", "harness"):
            continue
        else:
            rules = (
                (HARNESS, "the library imports the proof rig"),
                (RECIPES, "the library imports a recipe"),
            )
        for line, module in imported(root / rel, rel):
            out += [(rel.as_posix(), line, module, why) for prefix, why in rules if _under(module, prefix)]
    return out


def test_neither_the_library_nor_a_recipe_imports_the_proof_rig_and_the_library_imports_no_recipe():
    bad = [f"{f}:{line}: {why}: {module}" for f, line, module, why in refused()]
    assert not bad, "imports that go the wrong way:\n" + "\n".join(bad)


def test_the_check_sees_every_form_of_import_and_skips_the_harness_and_the_verl_trees(tmp_path):
    files = {
        "ascend_rl/good.py": '"""Fine."""\nfrom ascend_rl import locks\nimport ascend_rl.harnessed\n',
        "ascend_rl/a.py": '"""Bad."""\nfrom ascend_rl.harness import e2e\n',
        "ascend_rl/b.py": '"""Bad."""\nimport llm_rl.qwen2_5.x as x\n',
        "ascend_rl/cli/c.py": '"""Bad."""\nfrom .. import harness\n',
        "ascend_rl/d.py": '"""Bad."""\nimport importlib\n\nimportlib.import_module("ascend_rl.harness.e2e")\n',
        "ascend_rl/harness/ok.py": '"""The rig may."""\nfrom llm_rl.qwen2_5 import y\n',
        "llm_rl/r/e.py": '"""Bad."""\n\n\ndef f():\n    from ascend_rl import harness\n',
        "llm_rl/r/verl-0.6.0/verl/z.py": '"""A materialised tree."""\nfrom ascend_rl.harness import e2e\n',
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    got = {(f, line, module) for f, line, module, _ in refused(tmp_path)}
    assert got == {
        ("ascend_rl/a.py", 2, "ascend_rl.harness.e2e"),
        ("ascend_rl/b.py", 2, "llm_rl.qwen2_5.x"),
        ("ascend_rl/cli/c.py", 2, "ascend_rl.harness"),
        ("ascend_rl/d.py", 4, "ascend_rl.harness.e2e"),
        ("llm_rl/r/e.py", 5, "ascend_rl.harness"),
    }, got
