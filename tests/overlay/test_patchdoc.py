"""Patch identifiers, DEP-3 headers and the generated tables (ascend_rl/patchdoc.py), on the real patches.

Each check is also shown to fail: on a header with the defect (among them a field given twice, a required
field left empty, an Origin with no DEP-3 keyword, a line that is neither a field nor a continuation), a
duplicate identifier, a stale table, a Symbols field that does not match what the diff touches in the verl
0.6.0 sdist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import patchdoc

REPO = patchdoc.REPO
ID_IN_TEXT = re.compile(r"(?<![\w/-])((?:shared|ds|qw|cpu)-\d{4})(?![\w-])")
OLD_STYLE = re.compile(r"(?<![-\w])0\d{3}-(?:[a-z][a-z0-9.-]*|\*)(?:\.patch)?")
RETIRED = {"ds-0001"}


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    skip = (".lock", ".png", ".parquet", ".whl", ".gz")
    return [REPO / f for f in out.stdout.split() if not f.endswith(skip) and (REPO / f).is_file()]


def _header(path: str, **fields: str) -> patchdoc.Header:
    """A header as read_header would give it, from one line per field."""
    lines = [f"{k.replace('_', '-')}: {v}" for k, v in fields.items()]
    parsed = [(k.replace("_", "-"), v.split("\n")) for k, v in fields.items()]
    return patchdoc.Header(REPO / path, parsed, lines)


GOOD = dict(
    Description="a summary\nNot forwarded: a reason.",
    Author="someone",
    Origin="vendor, https://example.org/guide",
    Forwarded="no",
    Symbols="verl.x: f",
    Bases="0.6.0",
    Verified="a test",
    Needs_Hardware="none",
    Retire_When="upstream fixes it",
    Last_Update="2026-12-01",
)


def test_every_header_is_valid_and_every_identifier_unique() -> None:
    assert patchdoc.check_all() == []


def test_identifiers_start_with_their_folders_prefix() -> None:
    ids = {patchdoc.patch_id(p): p for p in patchdoc.all_patches()}
    assert None not in ids
    for ident, path in ids.items():
        assert ident.startswith(patchdoc.expected_prefix(path) + "-"), path
    assert {i.split("-")[0] for i in ids} == {"shared", "ds", "cpu"}


def test_a_good_header_passes_and_each_defect_is_named() -> None:
    where = "llm_rl/deepseek_r1/patches/ds-0999-example.patch"
    assert patchdoc.check_header(_header(where, **GOOD)) == []
    cases = {
        "Forwarded: 'no (not yet checked)' is not": dict(GOOD, Forwarded="no (not yet checked)"),
        "needs a 'Not forwarded: <why>' line": dict(GOOD, Description="a summary"),
        "missing DEP-3 field Retire-When": {k: v for k, v in GOOD.items() if k != "Retire_When"},
        "after 'vendor, ' comes a URL only": dict(GOOD, Origin="vendor, the DeepSeek guide (step 3)"),
        "Bug: 'verl#12' is not a URL": dict(GOOD, Bug="verl#12"),
        "is not YYYY-MM-DD": dict(GOOD, Last_Update="1 Dec 2026"),
        "unknown header field X-Note": dict(GOOD, X_Note="hi"),
    }
    for expected, fields in cases.items():
        problems = patchdoc.check_header(_header(where, **fields))
        assert any(expected in p for p in problems), (expected, problems)
    wide = _header(where, **GOOD)
    wide.lines.append(" " + "x" * 80)
    assert any("81 characters" in p for p in patchdoc.check_header(wide))
    misplaced = _header("llm_rl/deepseek_r1/patches/shared-0999-example.patch", **GOOD)
    assert any("should start with ds-" in p for p in patchdoc.check_header(misplaced))
    unnamed = _header("patches/verl/fix-padding.patch", **GOOD)
    assert any("<prefix>-<NNNN>-<slug>.patch" in p for p in patchdoc.check_header(unnamed))


GOOD_LINES = [
    "Description: a summary",
    " Not forwarded: a reason.",
    "Author: someone",
    "Origin: vendor, https://example.org/guide",
    "Forwarded: no",
    "Symbols: verl.x: f",
    "Bases: 0.6.0",
    "Verified: a test",
    "Needs-Hardware: none",
    "Retire-When: upstream fixes it",
    "Last-Update: 2026-12-01",
]


@pytest.mark.parametrize(
    "lines,expected",
    [
        (GOOD_LINES + ["Author: someone else"], "field Author: appears 2 times"),
        (
            [ln if ln != "Verified: a test" else "Verified:" for ln in GOOD_LINES],
            "missing DEP-3 field Verified:",
        ),
        (
            [ln.replace("Origin: vendor,", "Origin: vendored,") for ln in GOOD_LINES],
            "Origin: starts with 'vendored', not one of upstream, backport, vendor, other",
        ),
        (
            GOOD_LINES[:3] + ["a stray line"] + GOOD_LINES[3:],
            "header line 'a stray line' is neither a field nor a continuation",
        ),
    ],
    ids=["duplicate-field", "empty-required-field", "bad-origin-keyword", "stray-line"],
)
def test_a_header_read_from_its_file_names_each_defect_and_nothing_else(
    tmp_path: Path, lines: list[str], expected: str
) -> None:
    """read_header then check_header on a patch file: the good header passes (two Bug: URLs included, the one
    repeatable field); a field given twice, a required field left empty, an Origin that starts with no DEP-3
    keyword and a line that is neither a field nor a continuation are each refused, and only that is named."""
    where = "llm_rl/deepseek_r1/patches/ds-0999-example.patch"
    diff = ["", "diff --git a/verl/x.py b/verl/x.py", "--- a/verl/x.py", "+++ b/verl/x.py"]

    def check(header_lines: list[str]) -> list[str]:
        path = tmp_path / "ds-0999-example.patch"
        path.write_text("\n".join(header_lines + diff) + "\n")
        header = patchdoc.read_header(path)
        header.path = REPO / where  # checked as if it lay in the recipe's patches folder
        return patchdoc.check_header(header)

    bugs = ["Bug: https://example.org/issues/1", "Bug: https://example.org/issues/2"]
    assert check(GOOD_LINES + bugs) == []
    problems = check(lines)
    assert problems and all(p == f"{where}: {expected}" for p in problems), problems


def test_a_duplicate_identifier_is_refused(monkeypatch, tmp_path: Path) -> None:
    real = patchdoc.all_patches()
    twin = tmp_path / "ds-0004-another-offload.patch"
    twin.write_text((REPO / real[-1]).read_text())
    monkeypatch.setattr(patchdoc, "all_patches", lambda: real + [twin])
    assert any("identifier ds-0004 is also" in p for p in patchdoc.check_all())


def test_generated_tables_follow_the_headers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- patches:table deepseek_r1:own columns=id,what -->\n| stale |\n<!-- patches:end -->\n"
    )
    old, new = patchdoc.regenerate(readme)
    assert old != new and "| stale |" not in new
    rows = [line for line in new.splitlines() if line.startswith("| [`")]
    assert [r.split("`")[1] for r in rows] == [
        patchdoc.patch_id(p) for p in patchdoc.series("deepseek_r1:own")
    ]
    summary = patchdoc.read_header(patchdoc.series("deepseek_r1:own")[0]).summary
    assert summary in rows[0]
    readme.write_text(new)
    assert patchdoc.regenerate(readme)[0] == patchdoc.regenerate(readme)[1]


def test_the_repositorys_tables_are_generated_and_current() -> None:
    names = {patchdoc.rel(p) for p in patchdoc.readmes()}
    assert {
        "patches/README.md",
        "patches/cpu/README.md",
        "llm_rl/qwen2_5/README.md",
        "llm_rl/deepseek_r1/README.md",
    } <= names
    assert patchdoc.stale_blocks() == []


def test_symbols_are_what_each_diff_touches_in_the_sdist(verl_sdist_path: Path, monkeypatch) -> None:
    sdists = {"0.6.0": verl_sdist_path}
    computed = patchdoc.computed_symbols(sdists)
    assert set(computed) == {
        p
        for spec in ("qwen2_5@0.6.0", "deepseek_r1@0.6.0", "overlay:cpu@0.6.0")
        for p in patchdoc.series(spec)
    }
    offload = next(p for p in computed if patchdoc.patch_id(p) == "ds-0004")
    assert (
        "vLLMRollout.release" in computed[offload]["0.6.0"]
        and "verl.utils.explicit_offload (new)" in computed[offload]["0.6.0"]
    )
    assert patchdoc.symbol_problems(sdists) == []
    real = patchdoc.read_header

    def tampered(path: Path) -> patchdoc.Header:
        header = real(path)
        if patchdoc.patch_id(path) == "ds-0004":
            header.fields = [(k, ["verl.utils: nothing"] if k == "Symbols" else v) for k, v in header.fields]
        return header

    monkeypatch.setattr(patchdoc, "read_header", tampered)
    problems = patchdoc.symbol_problems(sdists)
    assert len(problems) == 1 and "ds-0004" in problems[0]


def test_every_patch_named_in_the_repository_exists() -> None:
    known = {patchdoc.patch_id(p) for p in patchdoc.all_patches()}
    missing, old_style = [], []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(REPO)
        if rel == Path(__file__).relative_to(REPO):
            continue  # this file makes up identifiers to show the checks fail
        for ident in set(ID_IN_TEXT.findall(text)) - known - RETIRED:
            missing.append(f"{rel}: {ident}")
        # tests/test_overlay* build throwaway series of their own; the changelog records the old names
        if not str(rel).startswith("tests/overlay/test_overlay") and str(rel) != "CHANGELOG.md":
            old_style += [f"{rel}: {m}" for m in OLD_STYLE.findall(text) if "0.13" not in m[:6]]
    assert missing == [], "patches named but not in the repository"
    assert old_style == [], "patch file names from before the identifiers"


def test_overlay_status_names_each_patch_by_identifier(pristine_verl: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ascend_rl",
            "overlay",
            "status",
            "deepseek_r1",
            "--base",
            "0.6.0",  # the fixture's tree (the recipe's default base is 0.9.1)
            "--target",
            str(pristine_verl),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [r[1] for r in rows] == [patchdoc.patch_id(p) for p in patchdoc.series("deepseek_r1@0.6.0")]


def test_cli_help_and_one_line_errors() -> None:
    script = ["-m", "ascend_rl", "patchdoc"]
    helped = subprocess.run([sys.executable, *script, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "check" in helped.stdout
    unknown = subprocess.run([sys.executable, *script, "show", "ds-9999"], capture_output=True, text=True)
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    shown = subprocess.run([sys.executable, *script, "show", "shared-0008"], capture_output=True, text=True)
    assert shown.returncode == 0 and "Retire-When:" in shown.stdout
