"""The resolve command (ascend_rl.manifest.resolve_launch): what a launch of a recipe on a verl base needs, resolved once.

    python3 -m ascend_rl resolve qwen2_5                       # the default base, as JSON
    python3 -m ascend_rl resolve deepseek_r1 --base 0.7.1 --profile cpu --shell   # bash assignments for eval

The launchers run `eval "$(python3 -m ascend_rl resolve RECIPE --base B --profile P --shell)"` instead of reading
recipe.toml themselves: VERL_BASE, RECIPE_TREE (the default verl tree), BASE_OVERRIDES and BASE_CPU_OVERRIDES
(the base's Hydra overrides, from its [bases."B"] table), BASE_CPU_ENV, RECIPE_DIE, and RECIPE_REWARD and
RECIPE_REWARD_FN (the reward file verl loads and its function, from [reward]). The JSON form adds the series, the
base's pin and the image. An unknown recipe, base or profile is one line on stderr and exit 2, the same for every
launcher.

    python3 -m ascend_rl resolve deepseek_r1 --base 0.9.1 --profile cpu --prepare-tree DIR [--dry-run]

--prepare-tree makes the launch's verl tree DIR ready the way the launcher's preflight does (the pinned tree fetched
when absent, the series applied; the overlay's own tree rebuilt when stale) and prints its line: ray_start.sh runs it
on every node before Ray starts, since a Ray worker started before the tree exists never imports it. --dry-run says
what it would change, writing nothing. A tree that cannot be made ready: one line, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ascend_rl import manifest
from ascend_rl.errors import EXIT_OK, EXIT_REFUSED, OverlayError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl resolve", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("recipe", help=f"the recipe ({', '.join(manifest.recipe_names())})")
    parser.add_argument("--base", default="", help="the verl base (default: the recipe's default_base)")
    parser.add_argument("--profile", default="npu", help="npu (default) or cpu (the CPU proof profile)")
    parser.add_argument("--shell", action="store_true", help="bash assignments for eval instead of JSON")
    parser.add_argument(
        "--prepare-tree",
        metavar="DIR",
        help="make the launch's verl tree DIR ready (fetch, apply the series) as the launcher's preflight does",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --prepare-tree: say what it would change"
    )
    args = parser.parse_args(argv)
    if args.dry_run and not args.prepare_tree:
        parser.error("--dry-run goes with --prepare-tree")
    try:
        launch = manifest.resolve_launch(args.recipe, args.base or None, args.profile)
    except OverlayError as exc:
        print(f"resolve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.prepare_tree:
        return _prepare_tree(launch, Path(args.prepare_tree), args.dry_run)
    print(launch.shell() if args.shell else json.dumps(launch.as_json(), indent=2))
    return EXIT_OK


def _prepare_tree(launch: manifest.Launch, verl_dir: Path, dry_run: bool) -> int:
    """The tree made ready (or, on a dry run, what would be done to it), in one line on stdout; a refusal in one
    line on stderr, exit 1."""
    from ascend_rl.preflight.report import PreflightError
    from ascend_rl.preflight.tree import fetch_change, plan_tree, prepare_tree

    try:
        fetch = fetch_change(launch, verl_dir) if dry_run else None
        if fetch:
            # said without fetching the sdist to check the series on a copy (the launcher's dry run does that)
            print(f"verl tree: would {fetch}")
        elif dry_run:
            with tempfile.TemporaryDirectory(prefix="resolve-tree-") as scratch:
                plan = plan_tree(launch, verl_dir, Path(scratch))
            print(f"verl tree: would {plan.change}" if plan.change else f"verl tree: {plan.check.detail}")
        else:
            check = prepare_tree(launch, verl_dir, log=lambda m: print(m, file=sys.stderr))
            print(f"verl tree: {check.detail}")
    except PreflightError as exc:
        print(f"resolve: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
