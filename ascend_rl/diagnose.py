"""Why a patch neither goes on nor comes off a tree: applied then edited, already carried, or conflicting.

`overlay status` and a refused apply or revert use this to name, for one patch, the file and hunk where
the tree differs, the lines the patch expects there against the lines found, and the next step. Pure
functions over bytes; ascend_rl/overlay.py feeds them its in-memory tree.

Hunks are placed the way patchset.apply_file places them: in order, each after the one before, nearest
to where its header says. A hunk not found exactly is placed at the region most like it (a window a few
lines longer or shorter than the hunk, for lines added or removed by hand). "Applied, then edited" is
decided by `tolerate`: the patch comes off once its edited regions are read as the patch has them, and
each such region is more like the patched lines than like the lines before the patch.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ascend_rl import patchset

EDITED, CARRIED, CONFLICTING = "applied, then edited", "carried", "conflicting"
SHOWN_LINES = 12  # at most this many lines of the expected-vs-found view
SLACK = 2  # a hand edit may add or remove up to this many lines inside one hunk's region
LIKE = 0.5  # a region less like the hunk than this is not the hunk's region


@dataclass
class Diagnosis:
    kind: str
    where: str  # "path: hunk #N (@@ ... @@)"
    lines: list[str] = field(default_factory=list)  # expected (-) against found (+), unified
    next_step: str = ""


@dataclass
class Edit:
    """One hunk of an applied patch whose lines were changed by hand."""

    path: str
    index: int
    header: str
    expected: list[bytes]  # the lines as the patch has them
    found: list[bytes]  # the lines in the tree

    @property
    def where(self) -> str:
        return f"{self.path}: hunk #{self.index} ({self.header})"


@dataclass
class Tolerated:
    """A patch applied across hand edits: every file's new content, and the hunks found edited."""

    contents: dict[str, bytes | None]
    edits: list[Edit]


def _text(block: list[bytes]) -> list[str]:
    return [b.decode("utf-8", "replace").rstrip("\r\n") for b in block]


def _view(expected: list[bytes], found: list[bytes], label: str) -> list[str]:
    diff = list(
        difflib.unified_diff(
            _text(expected), _text(found), f"{label} (the patch expects)", "found", lineterm="", n=1
        )
    )
    if len(diff) > SHOWN_LINES + 2:
        diff = diff[: SHOWN_LINES + 2] + [f"... ({len(diff) - SHOWN_LINES - 2} more lines)"]
    return diff


def likeness(expected: list[bytes], found: list[bytes]) -> float:
    """How alike two blocks of lines are, 0 to 1: an equal line counts 1, a changed line counts for how
    alike its text is (so an edited line reads as nearer its own original than as some other line)."""
    if not expected and not found:
        return 1.0
    score = 0.0
    matcher = difflib.SequenceMatcher(None, expected, found, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            score += i2 - i1
        elif tag == "replace":
            for a, b in zip(expected[i1:i2], found[j1:j2], strict=False):  # a replace pairs what it can
                score += difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    return 2 * score / (len(expected) + len(found))


def _region(lines: list[bytes], block: list[bytes], want: int, floor: int) -> tuple[float, int, int]:
    """(likeness by whole lines, position, length) of the window from `floor` on most like `block`; of
    equally alike windows, the nearest to `want`. Windows are up to SLACK lines longer or shorter; one
    less alike than LIKE is never taken (ratio 0.0 when none is)."""
    best = (0.0, 0, 0)
    need = Counter(block)
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(block)
    for span in range(max(len(block) - SLACK, 1), len(block) + SLACK + 1):
        # `shared`: the lines window and block have in common as multisets, slid along (an upper bound
        # on the ratio, as difflib's quick_ratio, so most windows are passed over without a diff)
        window = Counter(lines[floor : floor + span])
        shared = sum(min(window[line], n) for line, n in need.items())
        for at in range(floor, len(lines) - span + 1):
            if at > floor:
                gone, came = lines[at - 1], lines[at + span - 1]
                if gone in need:
                    shared -= window[gone] <= need[gone]
                    window[gone] -= 1
                if came in need:
                    shared += window[came] < need[came]
                    window[came] += 1
            if 2 * shared / (span + len(block)) < max(best[0], LIKE):
                continue
            matcher.set_seq1(lines[at : at + span])
            ratio = matcher.ratio()
            if ratio >= LIKE and (
                ratio > best[0] or (ratio == best[0] and abs(at - want) < abs(best[1] - want))
            ):
                best = (ratio, at, span)
    return best


def _carry(expected: list[bytes], replacement: list[bytes], found: list[bytes]) -> list[bytes]:
    """`replacement` for `found`, the region that stands for `expected`: the lines the hunk changes are
    replaced; its context lines keep what was found there (hand edits, lines added next to them)."""
    stand: list[list[bytes]] = [[] for _ in expected]
    lead: list[bytes] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, found, autojunk=False).get_opcodes():
        paired = min(i2 - i1, j2 - j1) if tag in ("equal", "replace") else 0
        for k in range(paired):
            stand[i1 + k].append(found[j1 + k])
        extra = found[j1 + paired : j2]
        if extra:
            (stand[i1 + paired - 1] if i1 + paired > 0 else lead).extend(extra)
    out = list(lead)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, expected, replacement, autojunk=False
    ).get_opcodes():
        if tag == "equal":
            for i in range(i1, i2):
                out.extend(stand[i])
        else:
            out.extend(replacement[j1:j2])
    return out


def _tolerate_file(
    fp: patchset.FilePatch, data: bytes | None, check: bool
) -> tuple[bytes | None, list[Edit]] | None:
    """Apply one file's hunks (old: what the tree should hold) across hand edits; None where it cannot.
    With `check`, a region found changed counts only when it is more like the hunk's old lines than
    like its new ones (else the hunk reads as not on)."""
    if fp.old_path is None:  # creates the file
        return (b"".join(fp.hunks[0].new), []) if data is None else None
    if data is None:
        return None
    lines = data.splitlines(keepends=True)
    if fp.new_path is None:  # deletes the file: the whole file is the region
        hunk = fp.hunks[0]
        if lines == hunk.old:
            return None, []
        if check and likeness(hunk.old, lines) < LIKE:
            return None
        return None, [Edit(fp.path, 1, hunk.header, hunk.old, lines)]
    out: list[bytes] = []
    edits: list[Edit] = []
    pos = delta = 0
    for index, hunk in enumerate(fp.hunks, start=1):
        want = max(hunk.old_start - 1 + delta, pos) if hunk.old else hunk.old_start + delta
        at = patchset._find(lines, hunk.old, want, pos)
        if at is not None:
            span, new = len(hunk.old), hunk.new
        else:
            ratio, at, span = _region(lines, hunk.old, want, pos)
            if ratio < LIKE:
                return None
            found = lines[at : at + span]
            if check and likeness(hunk.old, found) <= likeness(hunk.new, found):
                return None
            new = _carry(hunk.old, hunk.new, found)
            edits.append(Edit(fp.path, index, hunk.header, hunk.old, found))
        out.extend(lines[pos:at])
        out.extend(new)
        pos = at + span
        delta = at - (hunk.old_start - 1) if hunk.old else delta
    out.extend(lines[pos:])
    return b"".join(out), edits


def tolerate(
    patch: patchset.Patch, get: Callable[[str], bytes | None], check: bool = True
) -> Tolerated | None:
    """`patch` applied to the tree `get` reads where hunks were edited by hand: each hunk not found as it
    is goes where the lines most like it are. Pass `patch.reversed()` to take an applied, then edited
    patch off (the hand edits to its context lines stay, so patches beneath it see them too). None
    when some hunk has no such region, or (with `check`) when the region reads as not patched."""
    contents: dict[str, bytes | None] = {}
    edits: list[Edit] = []
    for fp in patch.files:
        got = _tolerate_file(fp, get(fp.path), check)
        if got is None:
            return None
        contents[fp.path], file_edits = got
        edits.extend(file_edits)
    return Tolerated(contents, edits)


def edited(patch: patchset.Patch, taken_off: Tolerated) -> Diagnosis:
    """The diagnosis of a patch that came off only across hand edits (`tolerate` of its reverse)."""
    order = {fp.path: n for n, fp in enumerate(patch.files)}
    edits = sorted(taken_off.edits, key=lambda e: (order.get(e.path, 0), e.index))
    if not edits:  # came off exactly after all: nothing to show
        return Diagnosis(EDITED, ", ".join(order), [], "")
    first = edits[0]
    more = f" (and {len(edits) - 1} more hunk{'s' if len(edits) > 2 else ''})" if len(edits) > 1 else ""
    return Diagnosis(
        EDITED,
        first.where + more,
        _view(first.expected, first.found, first.path),
        "a local edit in lines the patch changed: restore them as the patch has them (the - lines) and "
        "revert, or fetch a clean tree (`overlay fetch RECIPE --dest DIR`)",
    )


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


ON, OFF, DIFFERS = "on", "off", "differs"


def _hunks(
    fp: patchset.FilePatch, lines: list[bytes], own_base: bool
) -> list[tuple[int, patchset.Hunk, str, list[bytes]]]:
    """Each hunk of an existing file, placed in order: on (its new lines are there), off (its old lines
    are), or differs (neither; with the region most like its old lines)."""
    present = {line.strip() for line in lines}
    out = []
    pos = shift = 0
    for index, hunk in enumerate(fp.hunks, start=1):
        want_new, want_old = hunk.new_start - 1 + shift, hunk.old_start - 1 + shift
        at = patchset._find(lines, hunk.new, max(want_new, pos), pos) if hunk.new != hunk.old else None
        if at is not None:
            out.append((index, hunk, ON, []))
            pos, shift = at + len(hunk.new), at - (hunk.new_start - 1)
            continue
        at = patchset._find(lines, hunk.old, max(want_old, pos), pos)
        if at is not None:
            out.append((index, hunk, OFF, []))
            pos, shift = at + len(hunk.old), at - (hunk.old_start - 1)
            continue
        adds = [
            ln.strip() for ln in hunk.new if ln.strip() and ln.strip() not in {o.strip() for o in hunk.old}
        ]
        if not own_base and adds and all(a in present for a in adds):
            out.append((index, hunk, ON, []))  # the same change, in surroundings of another version
            continue
        _, at, span = _region(lines, hunk.old, max(want_old, pos), pos)
        out.append((index, hunk, DIFFERS, lines[at : at + span]))
    return out


def diagnose(
    patch: patchset.Patch, get: Callable[[str], bytes | None], upstream: str = "", own_base: bool = True
) -> Diagnosis:
    """Classify a patch that neither applies nor comes off the tree `get` reads (an applied, then edited
    patch is found by `tolerate` first). `own_base`: the tree is the version the series was written for
    (on another version, the patch's lines already there mean the tree carries the fix). `upstream`:
    evidence that the tree's version took the fix (the recipe manifest's `retired` table), if any."""
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
    on = total = 0
    first: Diagnosis | None = None  # the first hunk that differs from both sides
    half: tuple[str, int, patchset.Hunk] | None = None  # the first hunk still off
    fresh = "fetch a clean tree of the base"
    for fp in patch.files:
        data = get(fp.path)
        total += len(fp.hunks)
        if fp.old_path is None:  # the patch creates this file
            if data is not None and data == b"".join(fp.hunks[0].new):
                on += 1
            elif data is not None and first is None:
                first = Diagnosis(
                    CONFLICTING,
                    f"{fp.path}: the patch creates it but it already exists with other content",
                    [],
                    "move that file away or " + fresh,
                )
            continue
        if data is None:
            if first is None:
                first = Diagnosis(CONFLICTING, f"{fp.path}: the file does not exist", [], fresh)
            continue
        for index, hunk, state, found in _hunks(fp, data.splitlines(keepends=True), own_base):
            if state == ON:
                on += 1
            elif state == OFF and half is None:
                half = (fp.path, index, hunk)
            elif state == DIFFERS and first is None:
                first = Diagnosis(
                    CONFLICTING,
                    f"{fp.path}: hunk #{index} ({hunk.header})",
                    _view(hunk.old, found, fp.path),
                    "the tree differs where the patch goes: fetch a clean tree of the base (`overlay fetch`), "
                    "or `--force` on a tree of another version only after reading these lines",
                )
    already = f"; {on} of {total} hunks already read as the patch makes them" if on else ""
    if first is not None:
        first.where += already
        return first
    if half is not None:  # every hunk is either on or off: a patch half on
        path, index, hunk = half
        return Diagnosis(
            CONFLICTING,
            f"{path}: hunk #{index} ({hunk.header}) reads as before the patch{already}",
            _view(hunk.new, hunk.old, path),
            "the patch is partly on: take the tree back to the base (`overlay fetch` a clean one) or finish "
            "it by hand",
        )
    return Diagnosis(
        CONFLICTING,
        ", ".join(fp.path for fp in patch.files) + already,
        [],
        "the tree differs where the patch goes: " + fresh + " (`overlay fetch`)",
    )
