"""Per-die memory of every phase of a GRPO step, from a launcher's dry-run plan or its overrides.

The plan_memory command (ascend_rl/memory_plan.py says what is counted and how):

    bash llm_rl/qwen2_5/run_qwen2_5_1_5b_single.sh --json | python3 -m ascend_rl plan_memory
    python3 -m ascend_rl plan_memory --plan plan.json --set actor_rollout_ref.rollout.expert_reshard=allgather
    python3 -m ascend_rl plan_memory --recipe qwen2_5 -- trainer.n_gpus_per_node=1 ...   (a launcher's overrides)

Exit 0 when the peak fits the die less the headroom, 1 when it does not (one line saying which phase and
term), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from ascend_rl import memory_plan as mp

# What each optimisation buys: the same launch without it. Megatron + MoE: the AlltoAllV reshard and the explicit
# offload (the original's two); FSDP: the offloads verl offers that the single-card launch leaves off.
COMPARE = {
    "megatron": (
        ("all-gather reshard", {"actor_rollout_ref.rollout.expert_reshard": "allgather"}),
        ("no explicit offload", {"actor_rollout_ref.rollout.explicit_offload": False}),
    ),
    "fsdp": (
        ("+ optimizer offload", {"actor_rollout_ref.actor.fsdp_config.optimizer_offload": True}),
        (
            "+ optimizer and weight offload",
            {
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
                "actor_rollout_ref.actor.fsdp_config.param_offload": True,
            },
        ),
    ),
}
# verl 0.9.1's Megatron engine (memory_plan.megatron_engine): sleep level 1 (which verl forces on an NPU) or the
# explicit offload, both ways, and sleep level 1 freeing the die on several nodes as vLLM-Ascend's code says it does
# (the original found sleep mode did not; only a multi-node A3 run tells)
COMPARE_ENGINE = (
    ("all-gather reshard", {"actor_rollout_ref.rollout.expert_reshard": "allgather"}),
    ("explicit offload", {"actor_rollout_ref.rollout.explicit_offload": True}),
    ("sleep level 1 (kept on several nodes)", {"actor_rollout_ref.rollout.explicit_offload": False}),
    (
        "sleep level 1 (frees the die)",
        {"actor_rollout_ref.rollout.explicit_offload": False, "_sleep_frees": True},
    ),
    (
        "all-gather reshard, sleep level 1 (kept)",
        {
            "actor_rollout_ref.rollout.expert_reshard": "allgather",
            "actor_rollout_ref.rollout.explicit_offload": False,
        },
    ),
)
KEY_PHASES = ("generation", "weight sync and reshard", "actor update")


def compare_changes(settings) -> tuple:
    """The variants --compare plans beside the launch: those that change a setting of it."""
    strategy = str(settings["actor_rollout_ref.actor.strategy"])
    changes = COMPARE_ENGINE if mp.megatron_engine(settings) else COMPARE.get(strategy, ())
    return tuple(
        (label, change) for label, change in changes if any(settings.get(k) != v for k, v in change.items())
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl plan_memory",
        description=__doc__.splitlines()[0],
        epilog="Without --plan or overrides the plan JSON is read from stdin (a launcher's --json output).",
    )
    parser.add_argument(
        "--plan", metavar="FILE", help="the launcher's dry-run plan (--dry-run --json); - for stdin"
    )
    parser.add_argument(
        "--recipe", help="with overrides: the recipe (picks the die: [recipe] die in its recipe.toml)"
    )
    parser.add_argument(
        "--config-name",
        default=None,
        choices=sorted(mp.STRATEGY_OF_CONFIG),
        help="with overrides: the trainer config (default: ppo_megatron_trainer for deepseek_r1, else ppo_trainer)",
    )
    parser.add_argument(
        "--die", choices=sorted(mp.DIES), help="the die to plan against (default: the recipe's)"
    )
    parser.add_argument(
        "--model",
        choices=sorted(mp.KNOWN_MODELS),
        help="use the shipped config numbers of this model instead of the model folder's config.json",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one setting after the plan is read (repeatable), e.g. what-if offloads",
    )
    parser.add_argument("--stage", type=int, help="the PP stage to plan (default: the stage that peaks)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also print the launch without each optimisation: the all-gather reshard and no explicit offload "
        "(Megatron), the optimizer and weight offloads on (FSDP)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument("overrides", nargs="*", help="a launcher's Hydra overrides (after --)")
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> dict:
    if args.overrides:
        config = args.config_name or (
            "ppo_megatron_trainer" if args.recipe == "deepseek_r1" else "ppo_trainer"
        )
        settings = mp.settings_from_overrides(args.overrides, config)
        settings["_recipe"] = args.recipe
        return settings
    wanted = (
        "pipe a launcher's `--dry-run --json` output in (bash llm_rl/qwen2_5/run_qwen2_5_1_5b_single.sh --json | "
        "python3 -m ascend_rl plan_memory), pass --plan FILE, or give a launch's overrides after -- "
        "(with actor_rollout_ref.model.path=DIR or --model)"
    )
    if args.plan in (None, "-"):
        if args.plan is None and sys.stdin.isatty():
            raise ValueError(f"no launch to plan: {wanted}")
        text = sys.stdin.read()
        where = "stdin"
    else:
        with open(args.plan, encoding="utf-8") as fh:
            text = fh.read()
        where = args.plan
    if not text.strip():
        raise ValueError(f"no launch to plan: {where} is empty; {wanted}")
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{where} is not a launcher's JSON plan ({exc.msg}, line {exc.lineno}); {wanted}"
        ) from None
    if not isinstance(plan, dict) or "overrides" not in plan:
        raise ValueError(f"{where} has no 'overrides': give the JSON a launcher's --dry-run --json prints")
    return mp.settings_from_plan(plan)


def _apply(settings: dict, items: list[str]) -> dict:
    out = dict(settings)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
        out[key.lstrip("+")] = mp._value(value)
    return out


def compare_table(plans: list[tuple[str, mp.Plan]]) -> str:
    """One row per variant of the launch: the key phases' GiB (on the PP stage where each is largest), the peak,
    its largest term, whether it fits."""
    rows = [
        "| launch | "
        + " | ".join(f"{name} GiB" for name in KEY_PHASES)
        + " | peak (phase, largest term) | fits |",
        "|---" * (len(KEY_PHASES) + 3) + "|",
    ]
    for label, p in plans:
        big = p.peak.largest()
        sizes = [p.phase_max(n) for n in KEY_PHASES]
        cells = " | ".join("-" if n is None else f"{n / mp.GIB:.2f}" for n in sizes)
        rows.append(
            f"| {label} | {cells} | {p.peak.total / mp.GIB:.2f} ({p.peak.name}, {big.name} "
            f"{big.nbytes / mp.GIB:.2f}) | {'yes' if p.refusal() is None else '**no**'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None, out=None) -> int:
    """Entry point."""
    out = out or sys.stdout
    args = parse_args(argv)
    try:
        settings = _apply(_settings(args), args.set)
        plan = mp.plan_launch(settings, args.die, args.model, stage=args.stage)
        changes = compare_changes(settings) if args.compare else ()
        others = [
            (
                label,
                mp.plan_launch(
                    _apply(settings, [f"{k}={v}" for k, v in change.items()]), args.die, args.model
                ),
            )
            for label, change in changes
        ]
    except (OSError, ValueError, KeyError) as exc:
        print(f"plan_memory: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        doc = mp.as_json(plan)
        if others:
            doc["compare"] = {label: mp.as_json(p)["peak"] for label, p in others}
        print(json.dumps(doc), file=out)
    else:
        print(mp.table(plan), file=out)
        print("", file=out)
        for key, value in plan.facts:
            print(f"- {key}: {value}", file=out)
        if others:
            print("", file=out)
            print(compare_table([("as launched", plan), *others]), file=out)
    refusal = plan.refusal()
    if refusal:
        print(f"plan_memory: {refusal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
