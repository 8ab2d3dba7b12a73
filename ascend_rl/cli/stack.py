"""The stack command (ascend_rl.stack): compare the installed Ascend stack with a verl base's constraints file (by
default the default base's); exit 1 on any drift."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from ascend_rl import stack as _library
from ascend_rl.errors import UsageError
from ascend_rl.stack import (
    GIT_SOURCE,
    _norm,
    base_constraints,
    check,
    default_constraints,
    pinned_extras,
    read_git_sources,
    read_pins,
    recipe_extras,
    requirements_under_pins,
    select_pins,
    stacks,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    try:
        served = "; ".join(f"{path}: verl {', '.join(bases)}" for path, bases in stacks().items())
    except (UsageError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        served = f"(the recipes' manifests cannot be read: {exc})"
    parser = argparse.ArgumentParser(
        description=_library.__doc__.splitlines()[0],
        epilog=f"The constraints files and the verl bases each serves: {served}. Without --constraints the "
        "base's file is checked (--base, else the default base), and a drift is answered with pip install -c "
        "that file.",
    )
    parser.add_argument(
        "--constraints",
        type=Path,
        help="pins to check (default: the file of --base, else of the default base, as recipe.toml names it)",
    )
    parser.add_argument(
        "--recipe", help="also check this recipe's [stack] extras (llm_rl/<recipe>/recipe.toml)"
    )
    parser.add_argument(
        "--base",
        metavar="VERSION",
        help="with --recipe: check the stack of this verl base (its constraints file in recipe.toml)",
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="check only these packages")
    parser.add_argument(
        "--list-extras",
        action="store_true",
        help="print the recipe's extras that the constraints pin (the installer's list), one per line, and exit",
    )
    parser.add_argument(
        "--requirements",
        type=Path,
        metavar="FILE",
        help="print FILE's requirements with each package the constraints pin left to its pin, and exit",
    )
    parser.add_argument(
        "--git-source",
        metavar="NAME",
        help="print NAME's git URL and commit from the constraints file and exit",
    )
    args = parser.parse_args(argv)
    if args.base is not None and args.recipe is None:
        print(
            "stack: error: --base needs --recipe (the recipe.toml that names the base's stack)",
            file=sys.stderr,
        )
        return 2
    if args.constraints is None:
        # the base's own stack: --base, else the default base (the recipe's, or the one every recipe shares)
        try:
            if args.recipe is not None:
                args.constraints = base_constraints(args.recipe, args.base)
            else:
                args.constraints = default_constraints()
        except UsageError as exc:
            print(f"stack: error: {exc}", file=sys.stderr)
            return 2
    if not args.constraints.is_file():
        print(f"stack: error: {args.constraints} not found; pass --constraints FILE", file=sys.stderr)
        return 2
    try:
        extras = recipe_extras()
        sources = read_git_sources(args.constraints)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"stack: error: {exc}", file=sys.stderr)
        return 2
    if args.recipe is not None and args.recipe not in extras:
        known = ", ".join(extras) or "none"
        print(f"stack: error: unknown recipe '{args.recipe}'; known recipes: {known}", file=sys.stderr)
        return 2
    if args.list_extras:
        for name in pinned_extras(args.recipe or "", args.constraints, extras):
            print(name)
        return 0
    if args.requirements is not None:
        if not args.requirements.is_file():
            print(f"stack: error: {args.requirements} not found", file=sys.stderr)
            return 2
        for line in requirements_under_pins(args.requirements, args.constraints):
            print(line)
        return 0
    if args.git_source:
        if _norm(args.git_source) not in sources:
            print(
                f"stack: error: no '# {GIT_SOURCE} {args.git_source} URL COMMIT' line in {args.constraints}",
                file=sys.stderr,
            )
            return 2
        print(*sources[_norm(args.git_source)])
        return 0
    pins, skipped = select_pins(read_pins(args.constraints), args.recipe, extras)
    if args.only:
        wanted = {_norm(n) for n in args.only}
        pins = [(n, v) for n, v in pins if _norm(n) in wanted]
    if not pins:
        print(f"stack: error: no name==version pins to check in {args.constraints}", file=sys.stderr)
        return 2
    rows = check(pins, sources)
    width = max(len(r[0]) for r in rows)
    pin_w = max(12, *(len(r[1]) + 1 for r in rows))
    got_w = max(16, *(len(r[2]) + 1 for r in rows))
    print(f"{'package':<{width}}  {'pinned':<{pin_w}}{'installed':<{got_w}}status")
    for name, pinned, got, status in rows:
        print(f"{name:<{width}}  {pinned:<{pin_w}}{got:<{got_w}}{status}")
    bad = [r for r in rows if r[3] != "ok"]
    if bad:
        what = ", ".join(f"{n} {g} (pinned {p}, {s})" for n, p, g, s in bad)
        print(
            f"stack: error: {len(bad)} package(s) off the pins: {what}; "
            f"rerun scripts/install_npu_stack.sh or pip install -c {args.constraints.name} <name>",
            file=sys.stderr,
        )
        return 1
    note = f"; not checked, other recipes' extras: {', '.join(skipped)}" if skipped else ""
    print(f"stack matches {args.constraints.name} ({len(rows)} packages){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
