"""Compare the installed Ascend stack with constraints.txt; exit 1 on any drift.

Run after scripts/install_npu_stack.sh (it ends with this check): a later `pip install`
that silently replaced a pinned version (transformers, torch, ...) shows up here
before a training run does. Local version labels are ignored (torch 2.8.0+cpu is 2.8.0).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def read_pins(constraints: Path) -> list[tuple[str, str]]:
    """The (name, version) pairs of every `name==version` line, in file order."""
    pins = []
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            pins.append((name, version))
    return pins


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def matches(installed: str, pinned: str) -> bool:
    """True when `installed` is `pinned`, ignoring a local label on either side (+cpu)."""
    return installed.split("+", 1)[0] == pinned.split("+", 1)[0]


def check(pins: list[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """(name, pinned, installed, status) rows; status is ok, DRIFT or MISSING."""
    rows = []
    for name, pinned in pins:
        got = installed_version(name)
        status = "MISSING" if got is None else ("ok" if matches(got, pinned) else "DRIFT")
        rows.append((name, pinned, got or "-", status))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--constraints",
        type=Path,
        default=REPO / "constraints.txt",
        help="pins to check (default: %(default)s)",
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="check only these packages")
    args = parser.parse_args(argv)
    if not args.constraints.is_file():
        print(f"check_stack: error: {args.constraints} not found; pass --constraints FILE", file=sys.stderr)
        return 2
    pins = read_pins(args.constraints)
    if args.only:
        wanted = {n.lower().replace("_", "-") for n in args.only}
        pins = [(n, v) for n, v in pins if n.lower().replace("_", "-") in wanted]
    if not pins:
        print(f"check_stack: error: no name==version pins to check in {args.constraints}", file=sys.stderr)
        return 2
    rows = check(pins)
    width = max(len(r[0]) for r in rows)
    print(f"{'package':<{width}}  {'pinned':<12} {'installed':<16} status")
    for name, pinned, got, status in rows:
        print(f"{name:<{width}}  {pinned:<12} {got:<16} {status}")
    bad = [r for r in rows if r[3] != "ok"]
    if bad:
        what = ", ".join(f"{n} {g} (pinned {p})" for n, p, g, _ in bad)
        print(
            f"check_stack: error: {len(bad)} package(s) off the pins: {what}; "
            "rerun scripts/install_npu_stack.sh or pip install -c constraints.txt <name>",
            file=sys.stderr,
        )
        return 1
    print(f"stack matches {args.constraints.name} ({len(rows)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
