"""The patchdoc command (ascend_rl.patchdoc): patch headers as the one source of truth: identifiers, DEP-3 checks and the generated README tables."""

from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from pathlib import Path

from ascend_rl.patchdoc import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    DocError,
    _norm,
    all_patches,
    check_all,
    computed_symbols,
    format_symbols,
    pinned_sdist,
    read_header,
    readmes,
    regenerate,
    rel,
    set_symbols,
    symbol_problems,
)
from ascend_rl.patchset import patch_id


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
        help="also rewrite each header's Symbols field from its diff, read against the pinned verl sdist",
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
                problems += symbol_problems(pinned_sdist())
            except Exception as exc:  # DownloadError, ChecksumError: say so, never pass silently
                print(f"patchdoc: Symbols fields not checked: {exc}", file=sys.stderr)
            for problem in problems:
                print(f"patchdoc: {problem}", file=sys.stderr)
            if not problems:
                print(f"patchdoc: {len(all_patches())} patch headers valid, {len(readmes())} READMEs current")
            return EXIT_PROBLEMS if problems else EXIT_OK
        changed = 0
        if args.symbols:
            for path, value in computed_symbols(pinned_sdist()).items():
                if args.dry_run:
                    if _norm(read_header(path).get("Symbols")) != _norm(" ".join(format_symbols(value))[9:]):
                        print(f"patchdoc: would rewrite Symbols: of {rel(path)}")
                elif set_symbols(path, value):
                    print(f"patchdoc: rewrote Symbols: of {rel(path)}")
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
        return EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())
