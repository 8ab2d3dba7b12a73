"""Patch headers as the one source of truth: identifiers, DEP-3 checks and the generated README tables.

    python -m ascend_rl patchdoc list                 # every patch: identifier, file, summary
    python -m ascend_rl patchdoc show ds-0004         # one patch's header, field by field
    python -m ascend_rl patchdoc check                # headers valid, identifiers unique, tables current
    python -m ascend_rl patchdoc write [--dry-run]    # regenerate the tables in the READMEs

Identifiers. Every patch file is named <prefix>-<NNNN>-<slug>.patch and its identifier,
<prefix>-<NNNN>, is unique across the repository. The prefix says where the patch lives:
`shared` for patches/<project>/ (used by more than one recipe), an overlay's name for
patches/<overlay>/ (`cpu`), and a recipe's `id_prefix` (recipe.toml, [patches]) for
llm_rl/<recipe>/patches/.

Headers. DEP-3 fields (Description, Author, Origin, Bug, Forwarded, Applied-Upstream,
Last-Update) plus five of this repository's: Symbols (the upstream names the diff touches),
Verified (what was checked here, against which artifact), Needs-Hardware (what only an
Ascend host can show, or "none"), Retire-When, and Installs (`Installs: DEST from SOURCE`,
repeatable: a module of this repository the patch adds to the tree; ascend_rl/patchset.py). Every header line fits in 80 columns;
Forwarded is `no`, `not-needed` or a URL, and a patch not forwarded says why in a
"Not forwarded:" line of its Description.

Tables. A README block between `<!-- patches:table SERIES [columns=a,b,...] -->` and
`<!-- patches:end -->` (or `patches:details` for one section per patch) is generated from
the headers of SERIES: `shared` (patches/verl/ in order), a recipe's name (its series),
`<recipe>:own` (its own patches only) or `overlay:<name>`. Edit the headers, then run
`write`; `check` (and the test suite) fails when a block is stale.

Exit status: 0 fine, 1 problems found (one line each), 2 usage.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ascend_rl import artifacts, manifest, patchset
from ascend_rl.patchset import patch_id
from ascend_rl.paths import REPO

WIDTH = 80

REQUIRED = (
    "Description",
    "Author",
    "Origin",
    "Forwarded",
    "Symbols",
    "Bases",
    "Verified",
    "Needs-Hardware",
    "Retire-When",
    "Last-Update",
)
OPTIONAL = ("Bug", "Applied-Upstream", "Reviewed-by", "Installs")
REPEATABLE = ("Bug", "Installs")
ORIGIN_KEYWORDS = ("upstream", "backport", "vendor", "other")
URL = re.compile(r"^https?://\S+$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?: (.*))?$")
NAME = patchset.PATCH_NAME
BLOCK = re.compile(
    r"(?P<open><!-- patches:(?P<kind>table|details) (?P<args>[^>]*?) -->\n)(?P<body>.*?)(?P<close><!-- patches:end -->)",
    re.S,
)
COLUMNS = {
    "id": "patch",
    "what": "what",
    "symbols": "touches (upstream)",
    "verified": "verified here",
    "hardware": "needs hardware",
    "upstream": "upstream",
    "retire": "retire when",
    "bases": "verl bases",
}
DEFAULT_COLUMNS = ("id", "what", "verified", "hardware", "upstream", "retire")


class DocError(Exception):
    """A usage problem: an unknown patch, series or column."""


@dataclass
class Header:
    """A patch's header: its fields in order, each value as its lines (continuations unindented)."""

    path: Path
    fields: list[tuple[str, list[str]]]
    lines: list[str]  # the raw header lines, for the width check

    def values(self, name: str) -> list[str]:
        return [
            " ".join(s.strip() for s in v if s.strip() != ".").strip() for k, v in self.fields if k == name
        ]

    def get(self, name: str) -> str:
        found = self.values(name)
        return found[0] if found else ""

    @property
    def summary(self) -> str:
        for key, value in self.fields:
            if key == "Description":
                return value[0].strip() if value else ""
        return ""

    @property
    def long_description(self) -> list[str]:
        """The Description's lines after the summary; a lone '.' is an empty line (DEP-3)."""
        for key, value in self.fields:
            if key == "Description":
                return ["" if s.strip() == "." else s for s in value[1:]]
        return []

    @property
    def ident(self) -> str:
        return patch_id(self.path) or self.path.stem


def rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def read_header(path: Path) -> Header:
    """The fields before the diff: `Name: value` lines, each followed by its ` continuation` lines."""
    fields: list[tuple[str, list[str]]] = []
    raw: list[str] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(("diff --git", "--- ", "Index: ")) or not line.strip():
            break
        raw.append(line)
        m = FIELD.match(line)
        if m and not line.startswith(" "):
            fields.append((m.group(1), [m.group(2) or ""]))
        elif line.startswith(" ") and fields:
            fields[-1][1].append(line[1:])
        else:
            fields.append(("", [line]))  # neither a field nor a continuation: check() names it
    return Header(Path(path), fields, raw)


# --- where patches live and what their identifiers must start with -------------------------------


recipes = manifest.recipe_manifests
overlays = manifest.overlay_manifests


def expected_prefix(path: Path) -> str | None:
    """The identifier prefix the patch's folder calls for; None for a folder that holds no series."""
    parts = Path(rel(Path(path).resolve())).parts
    if len(parts) == 3 and parts[0] == "patches":
        folder = parts[1]
        ovl = overlays().get(folder)
        if ovl is not None:
            return ovl["overlay"].get("id_prefix", folder)
        return "shared"
    if len(parts) == 4 and parts[0] == "llm_rl" and parts[2] == "patches":
        data = recipes().get(parts[1])
        return data["patches"].get("id_prefix") if data else None
    return None


def all_patches() -> list[Path]:
    found = list((REPO / "patches").glob("*/*.patch")) + list((REPO / "llm_rl").glob("*/patches/*.patch"))
    return sorted(found, key=lambda p: (rel(p).startswith("llm_rl"), rel(p)))


def _split_base(spec: str) -> tuple[str, str | None]:
    name, _, base = spec.partition("@")
    return name, base or None


def recipe_series(name: str, base: str | None = None, overlay: str | None = None) -> list[Path]:
    """A recipe's series on `base` (default: its default base), with an overlay's after it."""
    data = recipes()[name]
    bases = manifest.manifest_bases(data)
    base = base or manifest.default_base(data)
    if base not in bases:
        raise DocError(f"recipe {name} has no base {base}; its bases: {', '.join(bases)}")
    paths = [REPO / p for p in bases[base]["series"]]
    if overlay:
        per_base = manifest.overlay_series(overlays()[overlay])
        paths += [REPO / p for p in per_base.get(base, [])]
    return paths


def all_bases() -> dict[str, str]:
    """Every verl base any recipe names: version -> the sdist's sha256."""
    found: dict[str, str] = {}
    for data in recipes().values():
        for version, table in manifest.manifest_bases(data).items():
            found.setdefault(version, table["sdist_sha256"])
    return found


def base_series() -> list[tuple[str, list[Path]]]:
    """(base, series) for every recipe on every base, alone and with each overlay that has that base."""
    out = []
    for name, data in recipes().items():
        for base in manifest.manifest_bases(data):
            out.append((base, recipe_series(name, base)))
            for ovl, odata in overlays().items():
                if base in manifest.overlay_series(odata):
                    out.append((base, recipe_series(name, base, ovl)))
    return out


def served_bases() -> dict[Path, set[str]]:
    """Each patch some series lists -> the bases whose series list it."""
    served: dict[Path, set[str]] = {}
    for base, paths in base_series():
        for path in paths:
            served.setdefault(path, set()).add(base)
    return served


def header_bases(header: Header) -> set[str]:
    return set(header.get("Bases").split())


def series(spec: str) -> list[Path]:
    """The patches a table shows, in order: shared[@BASE] | <recipe>[@BASE] | <recipe>:own |
    overlay:<name>[@BASE] (a recipe without @BASE: its default base; shared or an overlay: every base)."""
    spec, base = _split_base(spec)
    if spec == "shared":
        found = sorted((REPO / "patches" / "verl").glob("*.patch"))
        return [p for p in found if base is None or base in header_bases(read_header(p))]
    if spec.startswith("overlay:"):
        name = spec.split(":", 1)[1]
        if name not in overlays():
            raise DocError(f"unknown overlay '{name}' in a patches block; known: {', '.join(overlays())}")
        per_base = manifest.overlay_series(overlays()[name])
        if base is not None and base not in per_base:
            raise DocError(f"overlay {name} has no series for base {base}; its bases: {', '.join(per_base)}")
        paths = [REPO / p for b, ps in per_base.items() if base in (None, b) for p in ps]
        return list(dict.fromkeys(paths))
    name, _, own = spec.partition(":")
    if name not in recipes() or own not in ("", "own"):
        raise DocError(f"unknown series '{spec}'; use shared, <recipe>, <recipe>:own or overlay:<name>")
    paths = recipe_series(name, base)
    if own:
        paths = [p for p in paths if p.is_relative_to(REPO / "llm_rl" / name)]
    return paths


# --- the upstream symbols a patch touches, computed from the pinned sdist ------------------------------


def _scopes(source: bytes) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function and class, outermost first."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                found.append((first, child.end_lineno or child.lineno, name))
                walk(child, name + ".")

    walk(tree, "")
    return found


def _innermost(scopes: list[tuple[int, int, str]], line: int) -> str:
    best = ""
    for first, last, name in scopes:
        if first <= line <= last and name.count(".") >= best.count("."):
            best = name
    return best or "module scope"


def _file_symbols(path: str, old: bytes | None, new: bytes | None) -> str:
    """`verl.utils.device: get_torch_device, get_nccl_backend` for one file's change."""
    if not path.endswith(".py"):
        return f"{path}" + (" (new)" if old is None else "")
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    if old is None:
        return f"{module} (new)"
    if new is None:
        return f"{module} (removed)"
    old_lines, new_lines = old.splitlines(), new.splitlines()
    old_scopes, new_scopes = _scopes(old), _scopes(new)
    old_names = {n for _, _, n in old_scopes}
    names: list[str] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        hits = [_innermost(old_scopes, n + 1) for n in range(i1, i2)]
        for n in range(j1, j2):
            name = _innermost(new_scopes, n + 1)
            hits.append(name if name in old_names or name == "module scope" else f"{name} (new)")
        for name in hits:
            if name not in names:
                names.append(name)
    return f"{module}: {', '.join(names)}"


def upstream_files(sdist: Path) -> dict[str, bytes]:
    """The pinned project's files, keyed by their path inside the tree (verl/...)."""
    files = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if member.isfile() and len(parts) == 2:
                files[parts[1]] = tar.extractfile(member).read()
    return files


def computed_symbols(sdists: dict[str, Path]) -> dict[Path, dict[str, str]]:
    """Every series patch's touched symbols on each base it serves (base -> sdist), each computed on the
    tree as the patches before it in a series of that base left it."""
    result: dict[Path, dict[str, str]] = {}
    pristine: dict[str, dict[str, bytes]] = {}
    for base, paths in base_series():
        if base not in sdists:
            continue
        if base not in pristine:
            pristine[base] = upstream_files(sdists[base])
        tree = dict(pristine[base])
        for path in paths:
            patch = patchset.parse(path)
            entries = []
            for fp in patch.files:
                old = tree.get(fp.old_path) if fp.old_path else None
                try:
                    new = patchset.apply_file(fp, old)
                except patchset.HunkConflict as exc:
                    raise DocError(
                        f"{rel(path)} does not apply to verl {base}'s sdist after the patches before it in its "
                        f"series ({exc}); a CPU overlay patch may not depend on a recipe's patch"
                    ) from None
                entries.append(_file_symbols(fp.path, old, new))
                tree[fp.path] = new
            result.setdefault(path, {}).setdefault(base, "; ".join(entries))
    return result


def format_symbols(value: str) -> list[str]:
    """The Symbols field's lines: one file per line, wrapped at WIDTH with one-space continuations."""
    lines: list[str] = []
    entries = value.split("; ")
    for n, entry in enumerate(entries):
        text = (
            ("Symbols: " if n == 0 else " ")
            + entry.replace(" (", "\0(")
            + (";" if n < len(entries) - 1 else "")
        )
        wrapped = textwrap.wrap(
            text, WIDTH, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
        lines += [line.replace("\0", " ") for line in wrapped]
    return lines


def set_symbols(path: Path, value: str) -> bool:
    """Rewrite the header's Symbols field (added before Verified when missing); True if it changed."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    header = read_header(path)
    end = len(header.lines)
    body, rest = lines[:end], lines[end:]
    start = next((i for i, line in enumerate(body) if line.startswith("Symbols:")), None)
    if start is None:
        start = next(
            (
                i
                for i, line in enumerate(body)
                if line.startswith(("Verified:", "Needs-Hardware:", "Retire-When:", "Last-Update:"))
            ),
            len(body),
        )
        stop = start
    else:
        stop = start + 1
        while stop < len(body) and body[stop].startswith(" "):
            stop += 1
    new = body[:start] + format_symbols(value) + body[stop:]
    if new == body:
        return False
    tmp = Path(path).with_suffix(".patch.tmp")
    tmp.write_text("\n".join(new + rest), encoding="utf-8")
    tmp.replace(path)
    return True


# --- checks ----------------------------------------------------------------------------------------


def check_header(header: Header) -> list[str]:
    """Every problem of one header, each as `file: what is wrong`."""
    where = rel(header.path)
    problems = []
    names = [k for k, _ in header.fields]
    for key, value in header.fields:
        if key == "":
            problems.append(f"{where}: header line {value[0]!r} is neither a field nor a continuation")
        elif key not in REQUIRED + OPTIONAL:
            problems.append(f"{where}: unknown header field {key}: (known: {', '.join(REQUIRED + OPTIONAL)})")
        elif names.count(key) > 1 and key not in REPEATABLE:
            problems.append(f"{where}: field {key}: appears {names.count(key)} times")
    for key in REQUIRED:
        if key not in names or not header.get(key):
            problems.append(f"{where}: missing DEP-3 field {key}:")
    for n, line in enumerate(header.lines, 1):
        if len(line) > WIDTH:
            problems.append(f"{where}: header line {n} is {len(line)} characters (at most {WIDTH})")
    forwarded = header.get("Forwarded")
    if forwarded and forwarded not in ("no", "not-needed") and not URL.match(forwarded):
        problems.append(f"{where}: Forwarded: {forwarded!r} is not `no`, `not-needed` or a URL")
    if forwarded in ("no", "not-needed") and not any(
        s.strip().startswith("Not forwarded:") for s in header.long_description
    ):
        problems.append(
            f"{where}: Forwarded: {forwarded} needs a 'Not forwarded: <why>' line in the Description"
        )
    origin = header.get("Origin")
    if origin:
        keyword, _, url = origin.partition(", ")
        if keyword not in ORIGIN_KEYWORDS and not URL.match(origin):
            problems.append(
                f"{where}: Origin: starts with {keyword!r}, not one of {', '.join(ORIGIN_KEYWORDS)}"
            )
        elif keyword in ORIGIN_KEYWORDS and url and not URL.match(url):
            problems.append(f"{where}: Origin: after '{keyword}, ' comes a URL only, not {url!r}")
    for bug in header.values("Bug"):
        if not URL.match(bug):
            problems.append(f"{where}: Bug: {bug!r} is not a URL")
    if header.get("Last-Update") and not DATE.match(header.get("Last-Update")):
        problems.append(f"{where}: Last-Update: {header.get('Last-Update')!r} is not YYYY-MM-DD")
    ident = patch_id(header.path)
    prefix = expected_prefix(header.path)
    if ident is None:
        problems.append(f"{where}: file name is not <prefix>-<NNNN>-<slug>.patch")
    elif prefix is None:
        problems.append(f"{where}: no identifier prefix for this folder (recipe.toml [patches] id_prefix)")
    elif not ident.startswith(prefix + "-"):
        problems.append(f"{where}: identifier {ident} should start with {prefix}- (its folder's prefix)")
    return problems


def _norm(text: str) -> str:
    return " ".join(text.split())


def symbol_problems(sdists: dict[str, Path]) -> list[str]:
    """Headers whose Symbols field is not what the diff touches on each base it serves (read against
    that base's sdist), or whose diff touches different symbols on two bases."""
    problems = []
    for path, per_base in computed_symbols(sdists).items():
        values = set(per_base.values())
        if len(values) > 1:
            problems.append(
                f"{rel(path)}: the diff touches different symbols on bases {', '.join(sorted(per_base))}; "
                f"give each base a file of its own"
            )
            continue
        have = read_header(path).get("Symbols")
        want = " ".join(s.strip() for s in format_symbols(values.pop()))[len("Symbols: ") :]
        if _norm(have) != _norm(want):
            problems.append(f"{rel(path)}: Symbols: is {have!r}, the diff touches {want!r}")
    return problems


def base_sdists() -> dict[str, Path]:
    """Every base's verl sdist (cached, sha256-checked); artifacts.DownloadError when one cannot be had."""
    return {base: artifacts.verl_sdist(base, sha) for base, sha in all_bases().items()}


def symbols_for(computed: dict[Path, dict[str, str]], path: Path) -> str | None:
    """The Symbols value `write --symbols` sets: what the diff touches (the same on every base it serves)."""
    values = set(computed.get(path, {}).values())
    return values.pop() if len(values) == 1 else None


def base_problems() -> list[str]:
    """Each series patch's Bases: field must name exactly the bases whose series list it."""
    problems = []
    for path, bases in served_bases().items():
        if not path.is_file():
            continue
        have = header_bases(read_header(path))
        if have and have != bases:
            problems.append(
                f"{rel(path)}: Bases: says {' '.join(sorted(have))}, the manifests list it on "
                f"{' '.join(sorted(bases))}"
            )
    return problems


# --- the known trees (patches/trees.toml) ------------------------------------------------------------


def fingerprint_files() -> list[str]:
    """Every file any series of any base touches (the content a tree is recognised by)."""
    files = set()
    for _, paths in base_series():
        for path in paths:
            files.update(fp.path for fp in patchset.parse(path).files)
    return sorted(files)


def expected_trees(sdists: dict[str, Path]) -> tuple[str, list[str]]:
    """patches/trees.toml's text as the sdists and ../shared/trees give it; and what could not be read."""
    from ascend_rl import trees

    files = fingerprint_files()
    entries, missing = [], []
    for base, sdist in sorted(sdists.items()):
        read, version = trees.archive_reader(sdist)
        label = f"verl {base} (the PyPI sdist {sdist.name})"
        entries.append((base, version or base, label, {f: trees.file_digest(read(f)) for f in files}))
    for key, info in trees.NOT_BASES.items():
        archive = trees.SHARED_TREES / info["archive"]
        if not archive.is_file():
            missing.append(f"{archive} (the known tree {key}) is absent")
            old = {t.key: t for t in trees.load_known()}.get(key)
            if old is not None:  # keep what was recorded, for the files still fingerprinted
                kept = {f: d for f, d in old.files.items() if f in files}
                entries.append((key, old.version, old.label, kept))
            continue
        read, version = trees.archive_reader(archive)
        digests = {f: trees.file_digest(read(f)) for f in files}
        entries.append((key, version or info["version"], info["label"], digests))
    return trees.render(entries), missing


def check_all() -> list[str]:
    problems = []
    seen: dict[str, Path] = {}
    for path in all_patches():
        header = read_header(path)
        problems += check_header(header)
        ident = patch_id(path)
        if ident and ident in seen:
            problems.append(f"{rel(path)}: identifier {ident} is also {rel(seen[ident])}")
        seen.setdefault(ident or rel(path), path)
    prefixes: dict[str, str] = {}
    for name, data in recipes().items():
        prefix = data["patches"].get("id_prefix")
        if (REPO / "llm_rl" / name / "patches").is_dir() and not prefix:
            problems.append(f"llm_rl/{name}/recipe.toml: [patches] id_prefix is missing")
        if prefix in prefixes or prefix in ("shared", *overlays()):
            problems.append(f"llm_rl/{name}/recipe.toml: id_prefix {prefix!r} is already taken")
        if prefix:
            prefixes[prefix] = name
    problems += base_problems()
    for readme, stale in stale_blocks():
        problems.append(f"{rel(readme)}: {stale}; run: python -m ascend_rl patchdoc write")
    return problems


# --- rendering ---------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip() or "–"


def _link(path: Path, readme: Path) -> str:
    target = os.path.relpath(path, readme.parent)
    return f"[`{patch_id(path) or path.stem}`]({Path(target).as_posix()})"


def _upstream(header: Header) -> str:
    forwarded = header.get("Forwarded")
    parts = [f"forwarded: {forwarded}" if not URL.match(forwarded) else f"[forwarded]({forwarded})"]
    parts += [f"[bug]({bug})" for bug in header.values("Bug")]
    applied = header.get("Applied-Upstream")
    if applied:
        parts.append(
            f"[applied upstream]({applied})" if URL.match(applied) else f"applied upstream: {applied}"
        )
    return "; ".join(parts)


def _column(key: str, header: Header, readme: Path) -> str:
    if key == "id":
        return _link(header.path, readme)
    return {
        "what": lambda: header.summary,
        "symbols": lambda: header.get("Symbols"),
        "verified": lambda: header.get("Verified"),
        "hardware": lambda: header.get("Needs-Hardware"),
        "upstream": lambda: _upstream(header),
        "retire": lambda: header.get("Retire-When"),
        "bases": lambda: header.get("Bases"),
    }[key]()


def _parse_args(args: str) -> tuple[str, tuple[str, ...]]:
    words = args.split()
    if not words:
        raise DocError("a patches block names no series")
    columns = DEFAULT_COLUMNS
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key != "columns":
            raise DocError(f"unknown option {word!r} in a patches block (only columns=...)")
        columns = tuple(value.split(","))
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise DocError(f"unknown column(s) {', '.join(unknown)}; known: {', '.join(COLUMNS)}")
    return words[0], columns


def render_table(spec: str, columns: tuple[str, ...], readme: Path) -> str:
    rows = ["| " + " | ".join(COLUMNS[c] for c in columns) + " |", "|" + "---|" * len(columns)]
    for path in series(spec):
        header = read_header(path)
        rows.append("| " + " | ".join(_cell(_column(c, header, readme)) for c in columns) + " |")
    return "\n".join(rows) + "\n"


def _markdown(lines: list[str]) -> list[str]:
    """The long description as Markdown: prose lines joined into paragraphs, '- ' items kept as a list."""
    chunks: list[tuple[str, list[str], int]] = []  # (kind, words, indent of the item's text)
    for line in lines + [""]:
        text = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not text:
            chunks.append(("break", [], 0))
        elif text.startswith("- "):
            chunks.append(("item", [text[2:]], indent + 2))
        elif chunks and chunks[-1][0] == "item" and indent >= chunks[-1][2]:
            chunks[-1][1].append(text)
        elif chunks and chunks[-1][0] == "prose":
            chunks[-1][1].append(text)
        else:
            chunks.append(("prose", [text], indent))
    out: list[str] = []
    for n, (kind, words, _) in enumerate(chunks):
        if kind == "prose":
            out.append(" ".join(words) + "\n")
        elif kind == "item":
            last = n + 1 == len(chunks) or chunks[n + 1][0] != "item"
            out.append("- " + " ".join(words) + ("\n" if last else ""))
    return out


def render_details(spec: str, readme: Path) -> str:
    out = []
    for path in series(spec):
        header = read_header(path)
        out.append(f"### {header.ident}: {header.summary}\n")
        out.append(f"File: {_link(header.path, readme)}\n")
        out += _markdown(header.long_description)
        for key, label in (
            ("Symbols", "Touches"),
            ("Verified", "Verified here"),
            ("Needs-Hardware", "Needs hardware"),
            ("Retire-When", "Retire when"),
        ):
            out.append(f"- **{label}:** {header.get(key)}")
        out.append(f"- **Upstream:** {_upstream(header)}\n")
    return "\n".join(out)


def render_block(kind: str, args: str, readme: Path) -> str:
    spec, columns = _parse_args(args)
    return render_table(spec, columns, readme) if kind == "table" else render_details(spec, readme)


def readmes() -> list[Path]:
    """The READMEs of this repository (not of fetched upstream trees) that hold a patches block."""
    found = [
        REPO / "README.md",
        *(REPO / "patches").glob("**/README.md"),
        *(REPO / "llm_rl").glob("*/README.md"),
    ]
    found += (REPO / "llm_rl").glob("*/demo/README.md")
    return sorted(p for p in found if p.is_file() and "<!-- patches:" in p.read_text(encoding="utf-8"))


def regenerate(readme: Path) -> tuple[str, str]:
    """(current text, text with every block regenerated)."""
    text = readme.read_text(encoding="utf-8")

    def sub(m: re.Match) -> str:
        return m.group("open") + render_block(m.group("kind"), m.group("args"), readme) + m.group("close")

    return text, BLOCK.sub(sub, text)


def stale_blocks() -> list[tuple[Path, str]]:
    stale = []
    for readme in readmes():
        old, new = regenerate(readme)
        if old != new:
            stale.append((readme, "a generated patches block differs from the patch headers"))
    return stale


# --- command line ------------------------------------------------------------------------------------
