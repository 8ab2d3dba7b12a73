"""Check that every vllm / transformers-submodule import in a verl tree resolves against the real wheels.

The wheels are read as zip archives and their modules parsed with `ast`; nothing is installed
or executed. Resolution rules:

- a module exists when the wheel holds `pkg/mod.py`, `pkg/mod/__init__.py` or a compiled
  extension `pkg/mod.*.so`;
- a name imported from a module resolves when it is a submodule, or the module binds it at top
  level (def, class, assignment, import, including inside `if`/`try`/`with` blocks, so names
  under `if TYPE_CHECKING:` count), or a `from x import *` re-export provides it (followed up to
  a few levels), or it is listed in `__all__`;
- lazy modules: vllm's `__getattr__` modules and transformers' `_LazyModule` `__init__`s declare
  what they serve either in their `TYPE_CHECKING` block (covered above), in `__all__`, in string
  keys of a module-level dict that `__getattr__` reads (vllm's `MODULE_ATTRS`,
  `_DEPRECATED_MAPPINGS`) or in the string lists of `_import_structure`; those names count as
  defined. A name such a module does not declare is reported, even though a `__getattr__` exists.

Imports inside `try:` with an `except ImportError` / `ModuleNotFoundError` / `Exception` (or bare)
handler have a fallback, and so do imports in either branch of an `if` whose test is a version
check (any identifier containing "version", e.g. `is_transformers_version_in_range(...)`): the
other branch serves the pinned release. When they do not resolve they are reported as "guarded",
not as errors.
Attribute uses `X.Y` where `X` is an imported wheel class that is an `Enum` are checked too:
`Y` must be a member (or attribute) of that enum.
"""

from __future__ import annotations

import ast
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

CHECKED_PACKAGES = ("vllm", "transformers")
ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag", "ReprEnum"}
ENUM_BUILTIN_ATTRS = {"name", "value", "mro"}
FALLBACK_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
MAX_DEPTH = 6


@dataclass(frozen=True)
class ImportRef:
    """One import statement target found in the scanned tree."""

    path: str
    line: int
    module: str
    name: str | None  # None for `import module`
    alias: str | None
    guard: str  # "" when unguarded, else "try/except", "version check" or "except fallback"
    try_line: int = 0  # the `try:` this import sits in (its body or an except handler), 0 outside one

    def statement(self) -> str:
        """The import as it reads in source (one name)."""
        return f"from {self.module} import {self.name}" if self.name else f"import {self.module}"


@dataclass(frozen=True)
class Finding:
    """An import or enum attribute that does not resolve, with the reason."""

    path: str
    line: int
    what: str
    why: str
    guard: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}: {self.why}"


@dataclass
class Report:
    """The outcome of one scan."""

    checked: int = 0
    files: int = 0
    unresolved: list[Finding] = field(default_factory=list)
    guarded: list[Finding] = field(default_factory=list)


@dataclass
class _Exports:
    bound: dict[str, tuple] = field(default_factory=dict)  # name -> ("def", node) | ("from", mod, name) | ...
    stars: list[str] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)  # __all__, lazy tables
    has_getattr: bool = False


@dataclass(frozen=True)
class Resolution:
    """How a name resolved: its kind and, for classes defined in the wheel, the ClassDef."""

    kind: str
    module: str
    node: ast.ClassDef | None = None


class WheelIndex:
    """The modules of one or more wheels, read from their zip archives on demand and cached."""

    def __init__(self, wheels: list[Path]) -> None:
        self._members: dict[str, tuple[zipfile.ZipFile, str, bool]] = {}  # module -> (zip, member, is_pkg)
        self._extensions: set[str] = set()
        self._zips = [zipfile.ZipFile(w) for w in wheels]
        self._exports: dict[str, _Exports] = {}
        self._definitions: dict[str, dict[str, list[str]]] = {}  # package -> name -> modules
        for zf in self._zips:
            for member in zf.namelist():
                if member.endswith(".py"):
                    parts = member[:-3].split("/")
                    is_pkg = parts[-1] == "__init__"
                    if is_pkg:
                        parts = parts[:-1]
                    if parts and all(p.isidentifier() for p in parts):
                        self._members[".".join(parts)] = (zf, member, is_pkg)
                elif member.endswith(".so") or member.endswith(".pyd"):
                    head, _, tail = member.rpartition("/")
                    stem = tail.split(".", 1)[0]
                    self._extensions.add(f"{head.replace('/', '.')}.{stem}" if head else stem)

    def close(self) -> None:
        """Close the wheel archives."""
        for zf in self._zips:
            zf.close()

    def has_module(self, module: str) -> bool:
        """Whether the wheels hold `module` as source, package or compiled extension."""
        return module in self._members or module in self._extensions

    def owns(self, module: str) -> bool:
        """Whether `module` belongs to a top-level package of these wheels."""
        top = module.split(".", 1)[0]
        return self.has_module(top)

    def _parse(self, module: str) -> ast.Module | None:
        entry = self._members.get(module)
        if entry is None:
            return None
        zf, member, _ = entry
        try:
            return ast.parse(zf.read(member), filename=member)
        except SyntaxError:
            return None

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        is_pkg = self._members.get(module, (None, None, False))[2]
        base = module.split(".")
        if not is_pkg:
            base = base[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def exports(self, module: str) -> _Exports:
        """What `module` binds or declares at top level (cached)."""
        if module in self._exports:
            return self._exports[module]
        ex = _Exports()
        self._exports[module] = ex
        tree = self._parse(module)
        if tree is None:
            return ex
        dicts: dict[str, ast.Dict] = {}
        self._collect(module, tree.body, ex, dicts)
        getattr_fn = ex.bound.get("__getattr__")
        if getattr_fn and getattr_fn[0] == "def":
            ex.has_getattr = True
            used = {n.id for n in ast.walk(getattr_fn[1]) if isinstance(n, ast.Name)}
            for name in used & dicts.keys():
                ex.declared.update(_str_keys(dicts[name]))
        return ex

    def _collect(self, module: str, body: list[ast.stmt], ex: _Exports, dicts: dict[str, ast.Dict]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ex.bound[stmt.name] = ("def", stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    for name in _target_names(target):
                        ex.bound[name] = ("assign", None)
                        if isinstance(stmt.value, ast.Dict):
                            dicts[name] = stmt.value
                        if name == "__all__" and stmt.value is not None:
                            ex.declared.update(_str_constants(stmt.value))
                        if name == "_import_structure" and stmt.value is not None:
                            ex.declared.update(_str_constants(stmt.value, lists_only=True))
                    if _is_import_structure_item(target) and stmt.value is not None:
                        ex.declared.update(_str_constants(stmt.value))
            elif isinstance(stmt, ast.Expr) and _is_import_structure_call(stmt.value):
                for arg in stmt.value.args:
                    ex.declared.update(_str_constants(arg))
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        ex.bound[alias.asname] = ("module", alias.name)
                    else:
                        top = alias.name.split(".", 1)[0]
                        ex.bound[top] = ("module", top)
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt)
                for alias in stmt.names:
                    if alias.name == "*":
                        ex.stars.append(source)
                    else:
                        ex.bound[alias.asname or alias.name] = ("from", source, alias.name)
            elif isinstance(stmt, ast.If):
                self._collect(module, stmt.body, ex, dicts)
                self._collect(module, stmt.orelse, ex, dicts)
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                self._collect(module, stmt.body, ex, dicts)
                for handler in stmt.handlers:
                    self._collect(module, handler.body, ex, dicts)
                self._collect(module, stmt.orelse, ex, dicts)
                self._collect(module, stmt.finalbody, ex, dicts)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                self._collect(module, stmt.body, ex, dicts)

    def resolve(self, module: str, name: str, depth: int = 0) -> Resolution | None:
        """Resolve `from module import name`; None when the wheels do not provide it."""
        if self.has_module(f"{module}.{name}"):
            return Resolution("submodule", f"{module}.{name}")
        if depth > MAX_DEPTH:
            return Resolution("deep", module)
        ex = self.exports(module)
        entry = ex.bound.get(name)
        if entry is not None:
            if entry[0] == "def":
                node = entry[1] if isinstance(entry[1], ast.ClassDef) else None
                return Resolution("def", module, node)
            if entry[0] == "from":
                _, source, original = entry
                if self.owns(source) and self.has_module(source):
                    inner = self.resolve(source, original, depth + 1)
                    if inner is not None:
                        return inner
                return Resolution("reexport", module)
            return Resolution(entry[0], module)
        for source in ex.stars:
            if not self.has_module(source):
                continue
            src_ex = self.exports(source)
            if src_ex.declared and "__all__" in src_ex.bound and name not in src_ex.declared:
                continue
            if name.startswith("_") and name not in src_ex.declared:
                continue
            inner = self.resolve(source, name, depth + 1)
            if inner is not None:
                return inner
        if name in ex.declared:
            return Resolution("lazy", module)
        return None

    def find_definitions(self, name: str, package: str) -> list[str]:
        """Modules of `package` that define `name` with a top-level def/class (a hint for the report)."""
        if package not in self._definitions:
            table: dict[str, list[str]] = {}
            pattern = re.compile(rb"^(?:class|def|async def) (\w+)", re.M)
            for module, (zf, member, _) in sorted(self._members.items()):
                if module.split(".", 1)[0] == package:
                    for found in set(pattern.findall(zf.read(member))):
                        table.setdefault(found.decode(), []).append(module)
            self._definitions[package] = table
        return self._definitions[package].get(name, [])


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    return []


def _str_keys(node: ast.Dict) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _str_constants(node: ast.expr, lists_only: bool = False) -> set[str]:
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.List, ast.Tuple, ast.Set)) or not lists_only:
            elts = sub.elts if isinstance(sub, (ast.List, ast.Tuple, ast.Set)) else []
            out.update(e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return out


def _is_import_structure_item(target: ast.expr) -> bool:
    return (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and target.value.id == "_import_structure"
    )


def _is_import_structure_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"extend", "append"}
        and _is_import_structure_item(node.func.value)
    )


def _handler_names(handler: ast.ExceptHandler) -> set[str]:
    if handler.type is None:
        return {"BaseException"}
    nodes = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = set()
    for node in nodes:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def _is_checked(module: str) -> bool:
    top, _, rest = module.partition(".")
    if top == "vllm":
        return True
    # transformers' top-level namespace is one big lazy module; only its submodules are checked
    return top == "transformers" and bool(rest)


def find_imports(source: str, path: str) -> list[ImportRef]:
    """Every import of vllm or of a transformers submodule in one file's source."""
    tree = ast.parse(source, filename=path)
    refs: list[ImportRef] = []

    def visit(node: ast.AST, guarded: str, try_line: int = 0) -> None:
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            catches = set().union(*(_handler_names(h) for h in node.handlers)) if node.handlers else set()
            fallback = bool(catches & FALLBACK_EXCEPTIONS)
            body_guard = guarded or ("try/except" if fallback else "")
            for child in node.body:
                visit(child, body_guard, node.lineno if fallback else try_line)
            # an except handler's import runs only when the body's failed: check_file decides
            for child in node.handlers:
                visit(
                    child,
                    guarded or ("except fallback" if fallback else ""),
                    node.lineno if fallback else try_line,
                )
            for child in [*node.orelse, *node.finalbody]:
                visit(child, guarded, try_line)
            return
        if isinstance(node, ast.If) and _is_version_test(node.test):
            for child in [*node.body, *node.orelse]:
                visit(child, guarded or "version check", try_line)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_checked(alias.name):
                    refs.append(
                        ImportRef(path, node.lineno, alias.name, None, alias.asname, guarded, try_line)
                    )
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if _is_checked(node.module):
                for alias in node.names:
                    ref = ImportRef(
                        path, node.lineno, node.module, alias.name, alias.asname, guarded, try_line
                    )
                    refs.append(ref)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded, try_line)

    visit(tree, "")
    return refs


def _is_version_test(test: ast.expr) -> bool:
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if "version" in name.lower():
            return True
    return False


def _is_enum(node: ast.ClassDef) -> bool:
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        if name in ENUM_BASES:
            return True
    return False


def _class_attributes(node: ast.ClassDef) -> set[str]:
    names = set(ENUM_BUILTIN_ATTRS)
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                names.update(_target_names(target))
    return names


def check_file(index: WheelIndex, source: str, path: str, report: Report) -> None:
    """Resolve one file's imports and enum member uses, adding findings to `report`."""
    refs = find_imports(source, path)
    enums: dict[str, tuple[str, ast.ClassDef]] = {}
    results = [(ref, _resolve_ref(index, ref, enums)) for ref in refs]
    # a `try:` whose body's imports all resolve never runs its except handler's fallback import
    body_fails: dict[int, bool] = {}
    for ref, why in results:
        if ref.try_line and ref.guard != "except fallback":
            body_fails[ref.try_line] = body_fails.get(ref.try_line, False) or why is not None
    for ref, why in results:
        report.checked += 1
        if why is None:
            continue
        guard = ref.guard
        if guard == "except fallback" and body_fails.get(ref.try_line, True):
            guard = ""  # the body fails too (or imports nothing checked): the fallback is what runs
        finding = Finding(ref.path, ref.line, ref.statement(), why, guard)
        (report.guarded if guard else report.unresolved).append(finding)
    if not enums:
        return
    for node in ast.walk(ast.parse(source, filename=path)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in enums
            and not node.attr.startswith("__")
        ):
            where, cls = enums[node.value.id]
            if node.attr not in _class_attributes(cls):
                what = f"{node.value.id}.{node.attr}"
                why = f"enum {where}.{cls.name} has no member {node.attr}"
                report.unresolved.append(Finding(path, node.lineno, what, why))


def _resolve_ref(index: WheelIndex, ref: ImportRef, enums: dict[str, tuple[str, ast.ClassDef]]) -> str | None:
    if ref.name is None:
        parts = ref.module.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if not index.has_module(prefix):
                return f"no module {prefix} in the wheel"
        return None
    if not index.has_module(ref.module):
        return f"no module {ref.module} in the wheel{_hint(index, ref)}"
    if ref.name == "*":
        return None
    res = index.resolve(ref.module, ref.name)
    if res is None:
        return f"{ref.module} defines no {ref.name}{_hint(index, ref)}"
    if res.node is not None and _is_enum(res.node):
        enums[ref.alias or ref.name] = (res.module, res.node)
    return None


def _hint(index: WheelIndex, ref: ImportRef) -> str:
    if ref.name is None or ref.name == "*":
        return ""
    found = index.find_definitions(ref.name, ref.module.split(".", 1)[0])
    return f" (defined in {', '.join(found[:3])})" if found else ""


def iter_sources(tree: Path) -> list[Path]:
    """The .py files of a verl tree, skipping hidden and build folders."""
    skip = {"__pycache__", "build", "dist"}
    return sorted(
        p
        for p in tree.rglob("*.py")
        if not any(
            part.startswith(".") or part in skip or part.endswith(".egg-info")
            for part in p.relative_to(tree).parts
        )
    )


def scan_tree(tree: Path, wheels: list[Path]) -> Report:
    """Check every .py file under `tree` against the wheels."""
    index = WheelIndex(wheels)
    report = Report()
    try:
        for path in iter_sources(tree):
            rel = path.relative_to(tree).as_posix()
            try:
                source = path.read_text(encoding="utf-8")
                if (
                    "vllm" in source or "transformers." in source
                ):  # cheap pre-filter; most files import neither
                    check_file(index, source, rel, report)
            except (SyntaxError, UnicodeDecodeError) as exc:
                report.unresolved.append(Finding(rel, getattr(exc, "lineno", 0) or 0, "parse", str(exc)))
            report.files += 1
    finally:
        index.close()
    return report


def _default_wheels() -> list[Path]:
    from ascend_rl import artifacts  # the sibling module; imported late so --help works without it

    return [artifacts.wheel(name, artifacts.pinned(name)) for name in ("vllm", "transformers")]
