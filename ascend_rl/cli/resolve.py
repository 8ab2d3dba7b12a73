"""The resolve command (ascend_rl.manifest.resolve_launch): what a launch of a recipe on a verl base needs, resolved once.

    python3 -m ascend_rl resolve qwen2_5                       # the default base, as JSON
    python3 -m ascend_rl resolve deepseek_r1 --base 0.7.1 --profile cpu --shell   # bash assignments for eval

The launchers run `eval "$(python3 -m ascend_rl resolve RECIPE --base B --profile P --shell)"` instead of reading
recipe.toml themselves: VERL_BASE, RECIPE_TREE (the default verl tree), BASE_OVERRIDES and BASE_CPU_OVERRIDES
(the base's Hydra overrides, from its [bases."B"] table), BASE_CPU_ENV, RECIPE_DIE, and RECIPE_REWARD and
RECIPE_REWARD_FN (the reward file verl loads and its function, from [reward]). The JSON form adds the series, the
base's pin and the image. An unknown recipe, base or profile is one line on stderr and exit 2, the same for every
launcher.
"""

from __future__ import annotations

import argparse
import json
import sys

from ascend_rl import manifest
from ascend_rl.errors import EXIT_OK, OverlayError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl resolve", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("recipe", help=f"the recipe ({', '.join(manifest.recipe_names())})")
    parser.add_argument("--base", default="", help="the verl base (default: the recipe's default_base)")
    parser.add_argument("--profile", default="npu", help="npu (default) or cpu (the CPU proof profile)")
    parser.add_argument("--shell", action="store_true", help="bash assignments for eval instead of JSON")
    args = parser.parse_args(argv)
    try:
        launch = manifest.resolve_launch(args.recipe, args.base or None, args.profile)
    except OverlayError as exc:
        print(f"resolve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(launch.shell() if args.shell else json.dumps(launch.as_json(), indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
