"""An applied series, then one line edited by hand: reported as `edited` (file, hunk, expected and found
lines), never a traceback, never `conflicting`, and a revert that refuses in one line and changes nothing.

The walk edits one line that each hunk of each series adds (every recipe on every base its recipe.toml
lists, the shared patches included), on the real sdists, and asks the planner in-process; the last test
runs status, apply and revert as a user types them on one edited tree.
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import manifest, overlay, patchset
from ascend_rl.errors import OverlayError
from ascend_rl.paths import REPO

SERIES = [(name, base) for name in manifest.recipe_names() for base in manifest.load_recipe(name).bases]
MARK = b"  # a local edit"


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "overlay", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def edit(line: bytes) -> bytes:
    body = line.rstrip(b"\r\n")
    return body + MARK + line[len(body) :]


def hunk_lines(patches: list[patchset.Patch], read) -> list[tuple[int, str, int, int]]:
    """(patch position, file, hunk number, line number in the patched tree) for each hunk of the series:
    a line the hunk adds that the tree, every patch applied, still holds where the hunk put it (a later
    patch may rewrite some of a hunk's lines). Left out: hunks that add no line, and a hunk whose every
    added line a later patch rewrites (checked to be one)."""
    stage: dict[str, bytes | None] = {}
    out = []
    for k, patch in enumerate(patches):
        for fp in patch.files:
            stage[fp.path] = patchset.apply_file(fp, stage[fp.path] if fp.path in stage else read(fp.path))
        for fp in patch.files:
            now = (stage[fp.path] or b"").splitlines(keepends=True)
            same = _map(now, _final_lines(patches[k + 1 :], fp.path, stage[fp.path]))
            floor = 0
            for index, hunk in enumerate(fp.hunks, start=1):
                added = [i for i, ln in enumerate(hunk.new) if ln.strip() and ln not in hunk.old]
                if not added:
                    continue
                at = _locate(now, hunk.new, hunk.new_start - 1, floor)
                floor = at + len(hunk.new)
                kept = [same[at + i] for i in added if (at + i) in same]
                if kept:
                    out.append((k, fp.path, index, kept[0]))
                else:
                    assert any(fp.path in {f.path for f in p.files} for p in patches[k + 1 :]), (
                        f"{patch.name} {fp.path} hunk #{index}: its added lines are not in the patched tree"
                    )
    return out


def _final_lines(later: list[patchset.Patch], path: str, content: bytes | None) -> list[bytes]:
    """The file as the rest of the series leaves it."""
    for patch in later:
        for fp in patch.files:
            if fp.path == path:
                content = patchset.apply_file(fp, content)
    return (content or b"").splitlines(keepends=True)


def _map(old: list[bytes], new: list[bytes]) -> dict[int, int]:
    """Line number in `old` -> the same line's number in `new`, for lines later patches left alone."""
    out = {}
    for a, b, size in difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks():
        out.update({a + i: b + i for i in range(size)})
    return out


def _locate(lines: list[bytes], block: list[bytes], want: int, floor: int) -> int:
    hits = [i for i in range(floor, len(lines) - len(block) + 1) if lines[i : i + len(block)] == block]
    assert hits, "a hunk just applied is not in the file"
    return min(hits, key=lambda i: abs(i - want))


@pytest.mark.parametrize("name,base", SERIES, ids=[f"{n}@{b}" for n, b in SERIES])
def test_every_hunk_edited_by_hand_is_reported_edited(name, base, base_tree, pristine_base) -> None:
    recipe = manifest.load_recipe(name, base)
    tree = base_tree(base)
    overlay.apply_series(recipe, tree, log=lambda m: None)
    clean = tree_bytes(tree)
    patches = overlay.load_series(recipe)
    pristine = pristine_base(base)
    walk = hunk_lines(
        patches, lambda rel: (pristine / rel).read_bytes() if (pristine / rel).is_file() else None
    )
    assert len(walk) >= len(patches), "the walk found fewer hunks than patches"
    wrong = []
    for k, rel, index, lineno in walk:
        patch = patches[k]
        path = tree / rel
        data = path.read_bytes()
        lines = data.splitlines(keepends=True)
        original = lines[lineno]
        lines[lineno] = edit(original)
        path.write_bytes(b"".join(lines))
        try:
            states, _, _ = overlay.plan(recipe, tree.resolve())
            mine = states[k]
            where = f"{rel}: hunk #{index} ("
            shown = "\n".join(mine.lines or [])
            if mine.state != overlay.EDITED or not mine.detail.startswith(where):
                wrong.append(f"{patch.name} {rel} hunk #{index}: {mine.state}: {mine.detail}")
            elif original.decode().rstrip("\r\n") not in shown or MARK.decode() not in shown:
                wrong.append(
                    f"{patch.name} {rel} hunk #{index}: the expected/found lines miss the edit:\n{shown}"
                )
            for other in states:
                if other is mine or other.state == overlay.APPLIED:
                    continue
                # a later patch whose context holds the edited line is edited too; nothing else moves
                if other.state != overlay.EDITED or not other.detail.startswith(f"{rel}: hunk #"):
                    wrong.append(f"{patch.name} {rel} hunk #{index}: also {other.patch.name} {other.state}")
            with pytest.raises(OverlayError) as refused:
                overlay.revert_series(recipe, tree, dry_run=True, log=lambda m: None)
            message = str(refused.value)
            if "\n" in message or "was applied, then edited: " not in message or rel not in message:
                wrong.append(f"{patch.name} {rel} hunk #{index}: revert said {message!r}")
        finally:
            path.write_bytes(data)
    assert not wrong, f"{len(wrong)} of {len(walk)} hunks:\n" + "\n".join(wrong)
    assert tree_bytes(tree) == clean


def test_status_apply_revert_on_an_edited_tree(base_tree, pristine_base) -> None:
    """The issue's case: a line inside the function shared-0004 adds to metric_utils.py, on verl 0.7.1 (the default
    base then; 0.9.1 carries the same code as shared-0015), named with --base."""
    recipe = manifest.load_recipe("qwen2_5", "0.7.1")
    tree = base_tree(recipe.version)
    done = cli("apply", "qwen2_5", "--base", "0.7.1", "--target", tree)
    assert done.returncode == 0, done.stderr
    rel = "verl/trainer/ppo/metric_utils.py"
    path = tree / rel
    line = b'        metrics[f"reward_extra/{name}/mean"] = float(array.astype(np.float64).mean())\n'
    assert path.read_bytes().count(line) == 1
    path.write_bytes(path.read_bytes().replace(line, edit(line)))
    before = tree_bytes(tree)
    where = f"{rel}: hunk #1 (@@ -225,4 +225,27 @@)"

    status = cli("status", "qwen2_5", "--base", "0.7.1", "--target", tree)
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    row = next(ln for ln in status.stdout.splitlines() if "shared-0004" in ln)
    assert row.split()[0] == "edited", status.stdout
    assert f"applied, then edited: {where}" in status.stdout
    assert (
        '-        metrics[f"reward_extra/{name}/mean"]' in status.stdout and "# a local edit" in status.stdout
    )
    assert "conflicting" not in status.stdout
    assert tree_bytes(tree) == before

    for verb in ("apply", "revert"):
        for extra in ([], ["--dry-run"]):
            proc = cli(verb, "qwen2_5", "--base", "0.7.1", "--target", tree, *extra)
            err = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(err) == 1, proc.stderr
            assert "Traceback" not in proc.stderr and proc.stdout == ""
            assert err[0].startswith(
                "overlay: error: shared-0004-reward-extra-metrics.patch was applied, then edited: "
            )
            assert where in err[0] and err[0].endswith("; nothing was changed"), err[0]
            assert tree_bytes(tree) == before

    # Put the line back: the revert goes through and the tree is the release again.
    path.write_bytes(path.read_bytes().replace(edit(line), line))
    back = cli("revert", "qwen2_5", "--base", "0.7.1", "--target", tree)
    assert back.returncode == 0, back.stderr
    assert tree_bytes(tree) == tree_bytes(pristine_base(recipe.version))
