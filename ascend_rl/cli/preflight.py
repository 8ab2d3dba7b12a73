"""The preflight command (ascend_rl.preflight): check a launch before anything starts, print the report
(and with --json the plan), exit 0 / 1 / 2.

It resolves the recipe and its base once (manifest.resolve_launch) and hands the Launch to every check."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ascend_rl import manifest
from ascend_rl import preflight as _library
from ascend_rl.errors import OverlayError
from ascend_rl.memory_plan import short_plan_lines
from ascend_rl.paths import REPO
from ascend_rl.preflight import (
    TRAINER_CONFIGS,
    Check,
    PreflightError,
    check_cpu_runtime,
    check_data,
    check_group,
    check_layout,
    check_logger,
    check_lora,
    check_memory,
    check_model,
    check_nodes,
    check_npu,
    check_override_types,
    check_reward,
    check_rollout_budget,
    check_verl_config,
    compose,
    dry_run_view,
    install_tokenizer,
    key_facts,
    launch_plan,
    plan_env,
    plan_tree,
    prepare_tree,
    resolved_overrides,
    trainer_command,
)
from ascend_rl.preflight.shape import check_megatron_shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(
        description=_library.__doc__.splitlines()[0],
        epilog="Overrides follow '--', exactly as they will be passed to verl.trainer.main_ppo.",
    )
    parser.add_argument("--recipe", required=True, help="recipe name under llm_rl/ (qwen2_5, deepseek_r1)")
    parser.add_argument(
        "--base",
        metavar="VERSION",
        help="the verl base the launch uses (the recipe's [bases]; default: its default_base): the tree is "
        "checked against it and its series applied",
    )
    parser.add_argument(
        "--config-name", default="ppo_trainer", choices=TRAINER_CONFIGS, help="verl trainer config to compose"
    )
    parser.add_argument(
        "--verl-dir",
        type=Path,
        help="verl project tree to fetch/patch and compose against (default: the launch's, llm_rl/<recipe>/verl-<base>/ "
        "or, --with OVERLAY, verl-<base>-OVERLAY/)",
    )
    parser.add_argument(
        "--tokenizer-config",
        type=Path,
        help="install this tokenizer_config.json into the model directory before launch (once every check passed)",
    )
    parser.add_argument(
        "--nnodes",
        metavar="N",
        help="the node count the launcher starts and waits for (NNODES); refused unless trainer.nnodes is N",
    )
    parser.add_argument(
        "--made-by",
        metavar="COMMAND",
        help="what builds the model and data folders (the CPU profile's: make e2e), for their not-found lines",
    )
    parser.add_argument(
        "--may-be-absent",
        action="append",
        default=[],
        metavar="PATH",
        help="a model or data path this launch may not have yet (repeatable): the launcher's own default when "
        "MODEL_DIR / DATA_DIR are unset, or a checkpoint it writes before the trainer starts; a dry run warns when "
        "it is absent. An absent path not given here, and a file that is there but unreadable, empty or short of "
        "the columns verl reads, fail a dry run as they fail a launch",
    )
    parser.add_argument(
        "--skip-npu-check",
        action="store_true",
        help="do not require a visible NPU (for a launch host that only submits the job, e.g. a Ray head)",
    )
    parser.add_argument(
        "--with",
        dest="overlay",
        metavar="OVERLAY",
        help="also apply the overlay series patches/OVERLAY/ on top of the recipe's (the CPU profile: cpu)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="the launchers' CPU profile: check for vLLM's CPU build instead of an NPU",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="compose and check against a patched view of the tree, write nothing (but the pinned verl sdist into "
        "the download cache when the tree is absent and the sdist is not there yet: said), report machine checks (an "
        "absent default model or data folder, the NPU, ...) as warnings, say what a real launch would change, "
        "print the command; exit 0 unless a check that is not the machine's failed",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --dry-run: print the plan (trainer argv, final overrides, verl tree, environment) as one "
        "JSON object on stdout, the report on stderr",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="an environment variable the launcher sets for the trainer, for the plan (repeatable; "
        "NAME alone: its value here)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args(argv)
    if args.json and not args.dry_run:
        parser.error("--json prints the dry run's plan; add --dry-run")
    return args


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    """Run every check, print the report (with --json: the plan on out, the report on stderr); return the
    exit status. Nothing is written before every check passed, and nothing at all in a dry run."""
    if not (REPO / "llm_rl" / args.recipe / "recipe.toml").is_file():
        print(
            f"preflight: error: no recipe {args.recipe!r} under llm_rl/; use qwen2_5 or deepseek_r1",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="preflight-") as scratch:
        return _run(args, out, Path(scratch))


def _fail(out, lines: list[str]) -> int:
    out.flush()  # the report first, then its errors, when both go to one file
    for line in lines:
        print(f"preflight: error: {line}", file=sys.stderr)
    return 1


def _run(args: argparse.Namespace, out, scratch: Path) -> int:
    plan_out, out = (out, sys.stderr) if args.json else (None, out)
    try:
        # the one resolution of recipe and base: every check below is handed it, none reads the manifest again
        launch = manifest.resolve_launch(
            args.recipe, args.base or None, "cpu" if args.cpu else "npu", overlay=args.overlay or ""
        )
    except OverlayError as exc:
        print(f"preflight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    # a base that still lacks ports (its recipe.toml `pending` table) is not launched on an NPU: one line, before
    # anything is fetched or checked; a dry run reports it and goes on, the CPU profile is not refused
    pending = None if args.cpu else launch.recipe.pending_line()
    if pending and not args.dry_run:
        return _fail(out, [pending])
    verl_dir = (args.verl_dir or launch.verl_dir).resolve()
    try:
        tree = plan_tree(launch, verl_dir, scratch)
        cfg = compose(tree.view, args.config_name, args.overrides)
        check_override_types(compose(tree.view, args.config_name, [], resolve=False), cfg, args.overrides)
    except PreflightError as exc:
        return _fail(out, [str(exc)])

    composed = Check("config", "ok", f"{len(args.overrides)} overrides compose with {args.config_name}")
    checks = [tree.check, composed, check_verl_config(cfg, tree.view)]
    if pending:
        checks.append(Check("ports", "warn", f"{pending} (a real launch is refused)"))
    if args.nnodes is not None:
        checks.append(check_nodes(cfg, args.nnodes))
    layout = check_layout(cfg)
    if layout.status == "FAIL" and checks[2].status == "FAIL":
        # one line for one mistake: the layout's names the node counts that fit, verl's only the assertion
        checks[2] = Check(
            checks[2].name, "skipped", f"after the layout (verl refuses it too: {checks[2].detail})"
        )
    shape = check_megatron_shape(cfg, launch.name, launch.base)
    checks += [
        layout,
        shape,
        check_group(cfg),
        check_lora(cfg),
        check_rollout_budget(cfg, tree.view),
        check_reward(cfg, tree.view),
        check_model(cfg, args.made_by, args.may_be_absent),
        check_data(cfg, args.made_by, args.may_be_absent),
        check_logger(cfg),
    ]
    if (
        layout.status == "FAIL"
    ):  # sizes that do not divide the devices cannot be planned (they divide by zero)
        memory, memory_plan = Check("memory", "skipped", "not planned: the layout above does not fit"), None
    elif shape.status == "FAIL":  # nor can a split megatron-core would not build
        memory, memory_plan = (
            Check("memory", "skipped", "not planned: megatron-core refuses the layout"),
            None,
        )
    else:
        memory, memory_plan = check_memory(cfg, launch.name, args.cpu, launch.base)
    checks.append(memory)
    if args.cpu:
        checks.append(check_cpu_runtime(launch.base, REPO / launch.recipe.constraints))
    elif args.skip_npu_check:
        checks.append(Check("npu", "skipped", "--skip-npu-check"))
    else:
        checks.append(check_npu())
    model_ok = any(c.name == "model" and c.status == "ok" for c in checks)
    tokenizer = None
    if args.tokenizer_config and model_ok:
        tokenizer = install_tokenizer(cfg, args.tokenizer_config, dry_run=True)
        checks.append(tokenizer)

    if args.dry_run:
        dry_run_view(checks)
    failed = [c for c in checks if c.status == "FAIL"]
    print(f"preflight {args.recipe} ({args.config_name}){' [dry run]' if args.dry_run else ''}", file=out)
    for c in checks:
        print(f"  {c.name:<10} {c.status:<8} {c.detail}", file=out)
    if failed:
        return _fail(out, [c.detail for c in failed])

    changes = [f"verl tree: {tree.change}"] if tree.change else []
    if tokenizer is not None and not tokenizer.detail.startswith("already installed"):
        changes.append(f"model: {tokenizer.detail}")
    elif args.tokenizer_config and not model_ok:
        changes.append(f"model: install {args.tokenizer_config} into the model folder once it is there")
    if args.dry_run:
        print("a real launch changes, before the trainer starts:", file=out)
        for line in changes or ["nothing"]:
            print(f"  {line}", file=out)
        print("key settings:", file=out)
        for key, value in key_facts(cfg):
            print(f"  {key} = {value}", file=out)
        if memory_plan is not None:
            print(
                f"memory plan per die ({memory_plan.die.name}; python3 -m ascend_rl plan_memory for every term):",
                file=out,
            )
            for line in short_plan_lines(memory_plan):
                print(f"  {line}", file=out)
        n = len(resolved_overrides(args.overrides))
        print(
            f"command ({n} overrides, each key's last; the launcher passes all {len(args.overrides)}, in order):",
            file=out,
        )
        print(f"  {trainer_command(verl_dir, args.config_name, args.overrides)}", file=out)
    else:
        # every check passed: now the launch may write
        try:
            if tree.change:
                done_tree = prepare_tree(launch, verl_dir)
                print(f"preflight: {done_tree.detail}", file=out)
        except PreflightError as exc:
            return _fail(out, [str(exc)])
        if tokenizer is not None:
            done = install_tokenizer(cfg, args.tokenizer_config)
            if done.status == "FAIL":
                return _fail(out, [done.detail])
            print(f"preflight: tokenizer: {done.detail}", file=out)
    if plan_out is not None:
        plan = launch_plan(args, launch, verl_dir, plan_env(args.env), tree.view, changes)
        print(json.dumps(plan), file=plan_out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
