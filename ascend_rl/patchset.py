"""Parse unified diffs and apply them in memory, exactly (no fuzz), forward or in reverse.

The overlay tool builds on this: every patch of a series is checked against an
in-memory view of the tree before a single file on disk changes.

A patch's diffs change upstream's own lines. A module the patch adds to the tree is a real file of this
repository, named in the header by an `Installs:` field (`Installs: DEST from SOURCE`, DEST inside the tree,
SOURCE relative to the repository root); parse() reads SOURCE and turns it into a new-file diff of DEST, so
applying, reverting, status and the journal treat it exactly like a diff that creates the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ascend_rl.paths import REPO

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INSTALLS = re.compile(r"^Installs:[ \t]*(.*)$")
_UNSUPPORTED = (b"rename from", b"rename to", b"copy from", b"copy to", b"GIT binary patch", b"Binary files")


# NNNN-topic.patch with an identifier prefix: ds-0004-npu-explicit-offload.patch -> "ds-0004".
PATCH_NAME = re.compile(r"^([a-z][a-z0-9]*-\d{4})-[a-z0-9][a-z0-9.-]*\.patch$")


class PatchError(Exception):
    """A patch file cannot be parsed or is unsafe to apply."""


@dataclass
class Hunk:
    """One hunk: the old and new lines it covers (bytes, each with its own line ending)."""

    old_start: int
    new_start: int
    old: list[bytes] = field(default_factory=list)
    new: list[bytes] = field(default_factory=list)
    header: str = ""

    def reversed(self) -> Hunk:
        return Hunk(self.new_start, self.old_start, self.new, self.old, self.header)


@dataclass
class FilePatch:
    """The hunks for one file; `old_path` None means a new file, `new_path` None a deletion."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    def reversed(self) -> FilePatch:
        return FilePatch(self.new_path, self.old_path, [h.reversed() for h in self.hunks])


@dataclass
class Patch:
    """A parsed patch file: its header text (DEP-3) and its per-file diffs."""

    source: Path
    header: str
    files: list[FilePatch]

    @property
    def name(self) -> str:
        return self.source.name

    def reversed(self) -> Patch:
        return Patch(self.source, self.header, [f.reversed() for f in reversed(self.files)])


class HunkConflict(Exception):
    """A hunk's context is not in the file; carries the file and hunk for the message."""

    def __init__(self, path: str, index: int, hunk: Hunk | None, reason: str):
        self.path, self.index, self.hunk, self.reason = path, index, hunk, reason
        where = f"hunk #{index} ({hunk.header})" if hunk else "file"
        super().__init__(f"{path}: {where}: {reason}")


def _strip_path(raw: bytes, patch: Path) -> str | None:
    text = raw.decode("utf-8", "surrogateescape").split("\t", 1)[0].strip()
    if text.startswith('"'):
        raise PatchError(f"{patch.name}: quoted path {text} is not supported; regenerate the diff")
    if text == "/dev/null":
        return None
    safe_relpath(text, patch)  # refuse '..' and absolute paths before stripping anything
    parts = PurePosixPath(text).parts
    if len(parts) < 2:
        raise PatchError(
            f"{patch.name}: path '{text}' has no leading folder to strip (diffs are -p1: a/verl/...)"
        )
    return safe_relpath(str(PurePosixPath(*parts[1:])), patch)


def safe_relpath(text: str, patch: Path) -> str:
    """The path as a clean relative POSIX path, or PatchError when it would leave the tree."""
    pure = PurePosixPath(text)
    if not text or pure.is_absolute() or text.startswith("\\") or re.match(r"^[A-Za-z]:", text):
        raise PatchError(
            f"{patch.name}: path '{text}' is absolute; a patch may only touch files inside the tree"
        )
    if any(part == ".." for part in pure.parts):
        raise PatchError(f"{patch.name}: path '{text}' leaves the tree ('..'); refusing this patch")
    return str(pure)


def patch_id(path: Path) -> str | None:
    """`ds-0004` for llm_rl/deepseek_r1/patches/ds-0004-npu-explicit-offload.patch; None if misnamed."""
    m = PATCH_NAME.match(Path(path).name)
    return m.group(1) if m else None


def parse(path: Path, root: Path | None = None) -> Patch:
    """Parse a unified diff file (git or plain `diff -u` style) and the modules its header installs (SOURCE paths
    relative to `root`, default: this repository); PatchError on anything malformed."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PatchError(f"cannot read patch {path}: {exc.strerror}") from exc
    lines = data.splitlines(keepends=True)
    files: list[FilePatch] = []
    header_end: int | None = None
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if line.startswith(_UNSUPPORTED):
            raise PatchError(
                f"{Path(path).name}: line {i + 1}: renames, copies and binary diffs are not supported"
            )
        if line.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ "):
            if header_end is None:
                header_end = i
            old = _strip_path(line[4:], Path(path))
            new = _strip_path(lines[i + 1][4:], Path(path))
            if old is None and new is None:
                raise PatchError(f"{Path(path).name}: line {i + 1}: both sides are /dev/null")
            i += 2
            hunks: list[Hunk] = []
            while i < n and lines[i].startswith(b"@@"):
                hunk, i = _parse_hunk(lines, i, Path(path))
                hunks.append(hunk)
            if not hunks:
                raise PatchError(
                    f"{Path(path).name}: line {i + 1}: file section for {new or old} has no hunk"
                )
            files.append(FilePatch(old, new, hunks))
            continue
        if line.startswith(b"diff --git ") and header_end is None:
            header_end = i
        elif line.startswith(b"@@") and files:
            raise PatchError(f"{Path(path).name}: line {i + 1}: hunk outside a file section (corrupt patch)")
        i += 1
    header_lines = lines if header_end is None else lines[:header_end]
    files = installs(header_lines, Path(path), root) + files
    if not files:
        raise PatchError(f"{Path(path).name}: no file diffs found (corrupt or empty patch)")
    seen: set[str] = set()
    for fp in files:
        if fp.path in seen:
            raise PatchError(f"{Path(path).name}: {fp.path} appears twice; merge its hunks into one section")
        seen.add(fp.path)
    header = b"".join(header_lines).decode("utf-8", "replace")
    return Patch(Path(path), header, files)


def installs(header: list[bytes], patch: Path, root: Path | None = None) -> list[FilePatch]:
    """The new-file diffs of the header's `Installs: DEST from SOURCE` fields (a field may wrap onto ` `-indented
    continuation lines); SOURCE is read from `root` (default: the repository) and must stay inside it."""
    if root is None:
        root = REPO
    values: list[str] = []
    current: int | None = None  # the Installs value a continuation line extends
    for raw in header:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        m = _INSTALLS.match(line)
        if m:
            values.append(m.group(1).strip())
            current = len(values) - 1
        elif current is not None and line[:1] in (" ", "\t") and line.strip() not in ("", "."):
            values[current] += " " + line.strip()
        else:
            current = None
    found = []
    for value in values:
        parts = value.split()
        if len(parts) != 3 or parts[1] != "from":
            raise PatchError(f"{patch.name}: 'Installs: {value}' is not 'Installs: DEST from SOURCE'")
        dest, source = safe_relpath(parts[0], patch), safe_relpath(parts[2], patch)
        base = Path(root).resolve()
        file = (base / source).resolve()
        if not file.is_relative_to(base):
            raise PatchError(
                f"{patch.name}: Installs source {source} leaves the repository; refusing this patch"
            )
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise PatchError(
                f"{patch.name}: Installs source {source} cannot be read ({exc.strerror}); restore it"
            ) from exc
        if not data:
            raise PatchError(f"{patch.name}: Installs source {source} is empty; restore it")
        body = data.splitlines(keepends=True)
        found.append(FilePatch(None, dest, [Hunk(0, 1, [], body, header=f"@@ -0,0 +1,{len(body)} @@")]))
    return found


def render_new_file(fp: FilePatch) -> bytes:
    """A git-style new-file section for an installed module (what `git apply` and `patch -p1` take)."""
    body = fp.hunks[0].new
    out = [
        f"diff --git a/{fp.path} b/{fp.path}\n",
        "new file mode 100644\n",
        "--- /dev/null\n",
        f"+++ b/{fp.path}\n",
        f"@@ -0,0 +1,{len(body)} @@\n",
    ]
    data = "".join(out).encode()
    for line in body:
        data += b"+" + line
    if body and not body[-1].endswith(b"\n"):
        data += b"\n\\ No newline at end of file\n"
    return data


def self_contained(path: Path, root: Path | None = None) -> bytes:
    """The patch file as one plain diff: its header without the Installs fields, each installed module as a
    new-file section, then its own diffs; for `git apply`, `patch -p1` or quilt, with no repository beside it."""
    parse(path, root)  # refuses a malformed patch or an unreadable module first
    lines = Path(path).read_bytes().splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if line.startswith((b"diff --git ", b"--- ", b"Index: "))),
        len(lines),
    )
    header, skipping = [], False
    for line in lines[:start]:
        if line.startswith(b"Installs:"):
            skipping = True
            continue
        if skipping and line[:1] in (b" ", b"\t") and line.strip() not in (b"", b"."):
            continue
        skipping = False
        header.append(line)
    installed = installs(lines[:start], Path(path), root)
    return b"".join(header) + b"".join(render_new_file(fp) for fp in installed) + b"".join(lines[start:])


def _parse_hunk(lines: list[bytes], i: int, path: Path) -> tuple[Hunk, int]:
    m = _HUNK.match(lines[i])
    if not m:
        raise PatchError(f"{path.name}: line {i + 1}: malformed hunk header (corrupt patch)")
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    ranges = lines[i].split(b"@@")[1].strip().decode("ascii", "replace")
    hunk = Hunk(int(m.group(1)), int(m.group(3)), header=f"@@ {ranges} @@")
    i += 1
    last: list[list[bytes]] = []
    while len(hunk.old) < old_len or len(hunk.new) < new_len:
        if i >= len(lines):
            raise PatchError(f"{path.name}: hunk {hunk.header} is truncated (corrupt patch)")
        line = lines[i]
        tag, body = line[:1], line[1:]
        if line in (b"\n", b"\r\n"):  # some tools drop the space of an empty context line
            tag, body = b" ", line
        if tag == b" ":
            hunk.old.append(body)
            hunk.new.append(body)
            last = [hunk.old, hunk.new]
        elif tag == b"-":
            hunk.old.append(body)
            last = [hunk.old]
        elif tag == b"+":
            hunk.new.append(body)
            last = [hunk.new]
        elif tag == b"\\" and last:
            for side in last:
                side[-1] = side[-1].rstrip(b"\r\n")
        else:
            raise PatchError(
                f"{path.name}: line {i + 1}: unexpected line in hunk {hunk.header} (corrupt patch)"
            )
        i += 1
    if i < len(lines) and lines[i].startswith(b"\\") and last:
        for side in last:
            side[-1] = side[-1].rstrip(b"\r\n")
        i += 1
    if len(hunk.old) != old_len or len(hunk.new) != new_len:
        raise PatchError(
            f"{path.name}: hunk {hunk.header} line counts do not match its header (corrupt patch)"
        )
    return hunk, i


def apply_file(fp: FilePatch, content: bytes | None) -> bytes | None:
    """Apply one file's hunks to `content` (None: file absent); HunkConflict if they don't fit."""
    if fp.old_path is None:
        if content is not None:
            raise HunkConflict(fp.path, 0, None, "the patch creates it but it already exists")
        return b"".join(fp.hunks[0].new)
    if content is None:
        raise HunkConflict(fp.path, 0, None, "the file does not exist")
    lines = content.splitlines(keepends=True)
    out: list[bytes] = []
    pos = 0  # next unread line of `lines`
    delta = 0
    for index, hunk in enumerate(fp.hunks, start=1):
        want = max(hunk.old_start - 1 + delta, pos) if hunk.old else hunk.old_start + delta
        at = _find(lines, hunk.old, want, pos)
        if at is None:
            raise HunkConflict(fp.path, index, hunk, "its context does not match the file")
        out.extend(lines[pos:at])
        out.extend(hunk.new)
        pos = at + len(hunk.old)
        delta = at - (hunk.old_start - 1) if hunk.old else delta
    out.extend(lines[pos:])
    result = b"".join(out)
    if fp.new_path is None:
        if result:
            raise HunkConflict(fp.path, 0, None, "the patch deletes it but it holds other content")
        return None
    return result


def _find(lines: list[bytes], needle: list[bytes], want: int, floor: int) -> int | None:
    """The position nearest `want` (not before `floor`) where `needle` occurs exactly."""
    if not needle:
        return min(max(want, floor), len(lines))
    span = len(needle)
    limit = len(lines) - span
    for dist in range(0, max(limit, 0) + abs(want) + 2):
        for at in (want - dist, want + dist) if dist else (want,):
            if floor <= at <= limit and lines[at : at + span] == needle:
                return at
        if want - dist < floor and want + dist > limit:
            break
    return None
