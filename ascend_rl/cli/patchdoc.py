"""The patchdoc command (ascend_rl.patchdoc): patch headers as the one source of truth: identifiers, DEP-3 checks and the generated README tables."""

from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from pathlib import Path

from ascend_rl.errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from ascend_rl.patchdoc import (
    DocError,
    _norm,
    all_patches,
    base_sdists,
    check_all,
    computed_symbols,
    expected_trees,
    format_symbols,
    read_header,
    readmes,
    regenerate,
    rel,
    set_symbols,
    symbol_problems,
    symbols_for,
)
from ascend_rl.patchset import patch_id
from ascend_rl.trees import TREES_FILE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl patchdoc",
        description="Patch identifiers, DEP-3 header checks and the README tables generated from the headers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 fine, 1 problems found, 2 usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="every patch: identifier, file and summary")
    show = sub.add_parser("show", help="one patch's header, field by field")
    show.add_argument("ident", metavar="ID", help="a patch identifier, e.g. ds-0004")
    sub.add_parser("check", help="headers valid, identifiers unique, generated tables current")
    write = sub.add_parser("write", help="regenerate every patches block in the READMEs")
    write.add_argument("--dry-run", action="store_true", help="print the changes as a diff, write nothing")
    write.add_argument(
        "--symbols",
        action="store_true",
        help="also rewrite each header's Symbols field from its diff, read against each base's verl sdist",
    )
    write.add_argument(
        "--trees",
        action="store_true",
        help="also regenerate patches/trees.toml (the known trees' fingerprints) from the sdists and ../shared/trees",
    )
    return parser


def _find(ident: str) -> Path:
    for path in all_patches():
        if patch_id(path) == ident:
            return path
    known = ", ".join(filter(None, (patch_id(p) for p in all_patches())))
    raise DocError(f"no patch {ident!r}; known: {known}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            for path in all_patches():
                print(f"{patch_id(path) or '?':<12} {rel(path):<72} {read_header(path).summary}")
            return EXIT_OK
        if args.command == "show":
            header = read_header(_find(args.ident))
            print(f"{header.ident}  {rel(header.path)}")
            for key, value in header.fields:
                print(f"{key}: " + "\n  ".join(value))
            return EXIT_OK
        if args.command == "check":
            problems = check_all()
            try:
                sdists = base_sdists()
            except Exception as exc:  # DownloadError, ChecksumError: say so, never pass silently
                print(f"patchdoc: Symbols fields and patches/trees.toml not checked: {exc}", file=sys.stderr)
            else:
                problems += symbol_problems(sdists)
                want, missing = expected_trees(sdists)
                for note in missing:
                    print(f"patchdoc: {note}; its recorded fingerprint is kept unchecked", file=sys.stderr)
                have = TREES_FILE.read_text(encoding="utf-8") if TREES_FILE.is_file() else ""
                if have != want:
                    problems.append(
                        f"{rel(TREES_FILE)} is not current; run: python -m ascend_rl patchdoc write --trees"
                    )
            for problem in problems:
                print(f"patchdoc: {problem}", file=sys.stderr)
            if not problems:
                print(f"patchdoc: {len(all_patches())} patch headers valid, {len(readmes())} READMEs current")
            return EXIT_REFUSED if problems else EXIT_OK
        changed = 0
        sdists = base_sdists() if (args.symbols or args.trees) else {}
        if args.symbols:
            computed = computed_symbols(sdists)
            for path in computed:
                value = symbols_for(computed, path)
                if value is None:
                    print(f"patchdoc: {rel(path)} touches different symbols per base; not rewritten")
                elif args.dry_run:
                    if _norm(read_header(path).get("Symbols")) != _norm(" ".join(format_symbols(value))[9:]):
                        print(f"patchdoc: would rewrite Symbols: of {rel(path)}")
                elif set_symbols(path, value):
                    print(f"patchdoc: rewrote Symbols: of {rel(path)}")
        if args.trees:
            want, missing = expected_trees(sdists)
            for note in missing:
                print(f"patchdoc: {note}; its recorded fingerprint is kept", file=sys.stderr)
            have = TREES_FILE.read_text(encoding="utf-8") if TREES_FILE.is_file() else ""
            if have != want:
                changed += 1
                if args.dry_run:
                    print(f"patchdoc: would rewrite {rel(TREES_FILE)}")
                else:
                    tmp = TREES_FILE.with_suffix(".toml.tmp")
                    tmp.write_text(want, encoding="utf-8")
                    tmp.replace(TREES_FILE)
                    print(f"patchdoc: rewrote {rel(TREES_FILE)}")
        for readme in readmes():
            old, new = regenerate(readme)
            if old == new:
                continue
            changed += 1
            if args.dry_run:
                sys.stdout.writelines(
                    difflib.unified_diff(old.splitlines(True), new.splitlines(True), rel(readme), rel(readme))
                )
            else:
                tmp = readme.with_suffix(".md.tmp")
                tmp.write_text(new, encoding="utf-8")
                tmp.replace(readme)
                print(f"patchdoc: regenerated {rel(readme)}")
        if not changed:
            print("patchdoc: every generated block is current")
        return EXIT_OK
    except DocError as exc:
        print(f"patchdoc: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        print(f"patchdoc: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
