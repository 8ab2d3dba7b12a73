"""The compat command (ascend_rl.compat): check that every vllm / transformers-submodule import in a verl tree resolves against the real wheels."""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from ascend_rl.compat import _default_wheels, scan_tree


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 all resolve, 1 some do not, 2 usage."""
    parser = argparse.ArgumentParser(
        description="Report vllm / transformers-submodule imports in a verl tree that the real wheels do not provide."
    )
    parser.add_argument("tree", type=Path, help="verl project root (the folder containing verl/)")
    parser.add_argument(
        "--vllm-wheel",
        type=Path,
        help="vllm wheel (default: the cached wheel of the version constraints.txt pins)",
    )
    parser.add_argument(
        "--transformers-wheel",
        type=Path,
        help="transformers wheel (default: the cached wheel of the version constraints.txt pins)",
    )
    parser.add_argument(
        "--show-guarded", action="store_true", help="also list unresolved imports that have a fallback"
    )
    args = parser.parse_args(argv)

    if not (args.tree / "verl").is_dir():
        print(f"error: {args.tree} has no verl/ package; pass the verl project root", file=sys.stderr)
        return 2
    wheels = [args.vllm_wheel, args.transformers_wheel]
    for wheel in wheels:
        if wheel is not None and not zipfile.is_zipfile(wheel):
            print(f"error: {wheel} is not a wheel (zip) file; pass the downloaded .whl", file=sys.stderr)
            return 2
    if None in wheels:
        try:
            defaults = _default_wheels()
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        wheels = [w or d for w, d in zip(wheels, defaults, strict=True)]

    report = scan_tree(args.tree, wheels)
    for finding in report.unresolved:
        print(finding)
    if args.show_guarded:
        for finding in report.guarded:
            print(f"{finding} [guarded by {finding.guard}]")
    print(
        f"{len(report.unresolved)} unresolved, {len(report.guarded)} guarded, "
        f"{report.checked} imports checked in {report.files} files"
    )
    return 1 if report.unresolved else 0


if __name__ == "__main__":
    sys.exit(main())
