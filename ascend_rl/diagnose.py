"""Why a patch neither goes on nor comes off a tree: applied then edited, already carried, or conflicting.

`overlay status` and a refused apply or revert use this to name, for one patch, the file and hunk where
the tree differs, the lines the patch expects there against the lines found (nearest match), and the
next step. Pure functions over bytes; ascend_rl/overlay.py feeds them its in-memory tree.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from ascend_rl import patchset

EDITED, CARRIED, CONFLICTING = "applied, then edited", "carried", "conflicting"
SHOWN_LINES = 12  # at most this many lines of the expected-vs-found view


@dataclass
class Diagnosis:
    kind: str
    where: str  # "path: hunk #N (@@ ... @@)"
    lines: list[str] = field(default_factory=list)  # expected (-) against found (+), unified
    next_step: str = ""


def _text(block: list[bytes]) -> list[str]:
    return [b.decode("utf-8", "replace").rstrip("\r\n") for b in block]


def _find(lines: list[bytes], block: list[bytes]) -> bool:
    span = len(block)
    return span > 0 and any(lines[i : i + span] == block for i in range(len(lines) - span + 1))


def _nearest(lines: list[bytes], block: list[bytes]) -> tuple[float, int]:
    """(similarity, position) of the window of len(block) lines most like `block`."""
    want, span = _text(block), max(len(block), 1)
    have = _text(lines)
    best = (0.0, 0)
    for at in range(0, max(len(have) - span, 0) + 1):
        matcher = difflib.SequenceMatcher(None, want, have[at : at + span], autojunk=False)
        if matcher.real_quick_ratio() <= best[0] or matcher.quick_ratio() <= best[0]:
            continue
        ratio = matcher.ratio()
        if ratio > best[0]:
            best = (ratio, at)
    return best


def _view(expected: list[bytes], found: list[bytes], label: str) -> list[str]:
    diff = list(
        difflib.unified_diff(
            _text(expected), _text(found), f"{label} (the patch expects)", "found", lineterm="", n=1
        )
    )
    if len(diff) > SHOWN_LINES + 2:
        diff = diff[: SHOWN_LINES + 2] + [f"... ({len(diff) - SHOWN_LINES - 2} more lines)"]
    return diff


def added_lines(patch: patchset.Patch) -> dict[str, list[bytes]]:
    """Per file, the lines the patch adds (not its context), stripped, blank lines left out."""
    out: dict[str, list[bytes]] = {}
    for fp in patch.files:
        for hunk in fp.hunks:
            old = {line.strip() for line in hunk.old}
            out.setdefault(fp.path, []).extend(
                line.strip() for line in hunk.new if line.strip() and line.strip() not in old
            )
    return out


def carries(patch: patchset.Patch, get: Callable[[str], bytes | None]) -> bool:
    """True when every line the patch adds is already in its file (the same fix, made elsewhere)."""
    for path, added in added_lines(patch).items():
        data = get(path)
        if data is None:
            return False
        present = {line.strip() for line in data.splitlines()}
        if any(line not in present for line in added):
            return False
    return any(added_lines(patch).values())


def diagnose(
    patch: patchset.Patch, get: Callable[[str], bytes | None], upstream: str = "", own_base: bool = True
) -> Diagnosis:
    """Classify a patch that neither applies nor reverts on the tree `get` reads. `own_base`: the tree is
    the version the series was written for (then lines like the patch's own are a local edit of an applied
    patch; on another version, the same lines already there mean the tree carries the fix). `upstream`:
    evidence that the tree's version took the fix (the recipe manifest's `retired` table), if any."""
    on = off = 0
    edited: list[tuple[str, patchset.Hunk, int, list[bytes]]] = []
    conflict: list[tuple[str, patchset.Hunk, int, list[bytes]]] = []
    for fp in patch.files:
        data = get(fp.path)
        if fp.old_path is None:  # the patch creates this file
            if data is None:
                off += 1
            elif data == b"".join(fp.hunks[0].new):
                on += 1
            else:
                conflict.append((fp.path, patchset.Hunk(0, 0), -1, []))
            continue
        if data is None:
            conflict.append((fp.path, patchset.Hunk(0, 0), 0, []))
            continue
        lines = data.splitlines(keepends=True)
        present = {line.strip() for line in lines}
        for index, hunk in enumerate(fp.hunks, start=1):
            old = {line.strip() for line in hunk.old}
            adds = [ln.strip() for ln in hunk.new if ln.strip() and ln.strip() not in old]
            if _find(lines, hunk.new) and hunk.new != hunk.old:
                on += 1
            elif _find(lines, hunk.old):
                off += 1
            elif not own_base and adds and all(a in present for a in adds):
                on += 1  # the same change, in surroundings of another version
            else:
                r_new, at_new = _nearest(lines, hunk.new)
                r_old, at_old = _nearest(lines, hunk.old)
                if r_new > r_old and r_new >= 0.5:
                    edited.append((fp.path, hunk, index, lines[at_new : at_new + len(hunk.new)]))
                else:
                    conflict.append((fp.path, hunk, index, lines[at_old : at_old + len(hunk.old)]))
    if not own_base and (upstream or carries(patch, get)):
        why = (
            f"this tree's verl does not need it ({upstream})"
            if upstream
            else "every line it adds is already in the tree"
        )
        return Diagnosis(
            CARRIED,
            ", ".join(fp.path for fp in patch.files),
            [],
            f"{why}: use the series of the base this tree is (`overlay status --base VERSION`), not this one",
        )
    if own_base and edited and not conflict:
        path, hunk, index, found = edited[0]
        return Diagnosis(
            EDITED,
            f"{path}: hunk #{index} ({hunk.header})",
            _view(hunk.new, found, path),
            "a local edit in lines the patch changed: restore them as the patch has them (the - lines) and "
            "revert, or fetch a clean tree (`overlay fetch RECIPE --dest DIR`)",
        )
    path, hunk, index, found = (conflict or edited)[0]
    total = on + off + len(edited) + len(conflict)
    already = f"; {on} of {total} hunks already read as the patch makes them" if on else ""
    if index == 0:
        return Diagnosis(
            CONFLICTING, f"{path}: the file does not exist", [], "fetch a clean tree of the base"
        )
    if index == -1:
        return Diagnosis(
            CONFLICTING,
            f"{path}: the patch creates it but it already exists with other content",
            [],
            "move that file away or fetch a clean tree of the base",
        )
    expected = hunk.old if conflict else hunk.new
    return Diagnosis(
        CONFLICTING,
        f"{path}: hunk #{index} ({hunk.header}){already}",
        _view(expected, found, path),
        "the tree differs where the patch goes: fetch a clean tree of the base (`overlay fetch`), "
        "or `--force` on a tree of another version only after reading these lines",
    )
