"""Regenerate llm_rl/qwen2_5/demo/problems.jsonl: small-integer MATH-style problems for the CPU demo."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ascend_rl.tiny import problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=problems.BUNDLED, help="JSONL to write (default: %(default)s)"
    )
    parser.add_argument("--train", type=int, default=240, help="train problems (default: %(default)s)")
    parser.add_argument("--test", type=int, default=16, help="test problems (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=2026, help="generator seed (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the first problems, write nothing")
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1 or args.train + args.test > 600:
        parser.error("--train and --test must be at least 1 and at most 600 together (the templates run out)")
    rows = problems.generate_problems(args.train, args.test, args.seed)
    if args.dry_run:
        for row in rows[:5]:
            print(row)
        print(f"would write {len(rows)} problems to {args.out}")
        return 0
    problems.write_problems(rows, args.out)
    print(f"wrote {len(rows)} problems ({args.train} train, {args.test} test) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
