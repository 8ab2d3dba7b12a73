"""What a launch runs, as text and as data: the key settings, the trainer's command, the dry run's JSON plan.

The command line shows each key's last override (Hydra's last-one-wins); the plan (`launch_plan`) is what a tool
reading the launch needs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from ascend_rl import overlay
from ascend_rl.manifest import Launch

# What the printed summary shows of the composed config (missing keys are left out).
KEY_FACTS = (
    "actor_rollout_ref.model.path",
    "data.train_files",
    "data.val_files",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "algorithm.adv_estimator",
    "custom_reward_function.path",
    "custom_reward_function.name",
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.expert_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "trainer.device",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.total_epochs",
    "trainer.save_freq",
    "trainer.logger",
    "trainer.resume_mode",
    "trainer.max_actor_ckpt_to_keep",
)


def key_facts(cfg) -> list[tuple[str, str]]:
    """The settings worth seeing before a run, as (key, value) pairs."""
    sentinel = object()
    facts = []
    for key in KEY_FACTS:
        value = OmegaConf.select(cfg, key, default=sentinel)
        if value is sentinel:
            continue
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        facts.append((key, str(value)))
    return facts


def trainer_argv(config_name: str, overrides: list[str]) -> list[str]:
    """The argv of the trainer the launcher runs (this Python is the launcher's)."""
    argv = [sys.executable, "-m", "verl.trainer.main_ppo"]
    if config_name != "ppo_trainer":
        argv += ["--config-name", config_name]
    return argv + list(overrides)


def trainer_command(verl_dir: Path, config_name: str, overrides: list[str]) -> str:
    """The launcher's command line with each key's last override only (the config it composes is the same),
    one override a line."""
    head = f"PYTHONPATH={shlex.quote(str(verl_dir))}${{PYTHONPATH:+:$PYTHONPATH}} " + shlex.join(
        trainer_argv(config_name, [])
    )
    return " \\\n    ".join([head, *(shlex.quote(o) for o in resolved_overrides(overrides))])


def resolved_overrides(overrides: list[str]) -> list[str]:
    """The overrides with Hydra's last-one-wins applied: each key once, where it first appears, written as its
    last override (with the + of the override that added it); a key added and then deleted is left out."""
    ops: dict[str, list] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group + (f"@{override.package}" if override.package else "")
        ops.setdefault(key, []).append(override)
    resolved = []
    for key, seq in ops.items():
        last = seq[-1]
        if any(o.is_delete() for o in seq[:-1]):
            resolved += [o.input_line for o in seq]  # deleted, then set again: as given
        elif last.is_delete():
            if not any(o.is_add() or o.is_force_add() for o in seq):
                resolved.append(last.input_line)  # a key of verl's config, removed
        else:
            value = last.input_line.partition("=")[2]
            added = next((o for o in seq if o.is_add() or o.is_force_add()), None)
            prefix = "" if added is None else ("++" if added.is_force_add() else "+")
            resolved.append(f"{prefix}{key}={value}")
    return resolved


def final_overrides(overrides: list[str]) -> dict[str, str | None]:
    """Each config key's last override as Hydra applies them (last one wins), keys without their +, ++ or ~
    and in the order they first appear; a key whose last override deletes it (~key) maps to None."""
    final: dict[str, str | None] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group + (f"@{override.package}" if override.package else "")
        final[key] = None if override.is_delete() else override.input_line.partition("=")[2]
    return final


def launch_plan(
    args: argparse.Namespace,
    launch: Launch,
    verl_dir: Path,
    env: dict[str, str | None],
    view: Path | None = None,
    changes: list[str] | None = None,
) -> dict:
    """The dry run's plan: the trainer's argv and working folder, the overrides after last-one-wins, the verl
    tree (its version, from `view` when the tree is still to be fetched or patched, and the launch's base), the
    config name, the environment the launcher sets and what a real launch writes before the trainer starts."""
    spec = launch.recipe
    return {
        "recipe": launch.name,
        "config_name": args.config_name,
        "verl": {
            "tree": str(verl_dir),
            "version": overlay.tree_version(view or verl_dir, spec.project),
            "base": {
                "version": spec.version,
                "tag": spec.tag,
                "commit": spec.commit,
                "pending": dict(spec.pending),
            },
            "overlay": launch.overlay or None,
        },
        "argv": trainer_argv(args.config_name, args.overrides),
        "cwd": str(spec.folder),
        "override_args": list(args.overrides),
        "overrides": final_overrides(args.overrides),
        "env": env,
        "changes": list(changes or []),
    }


def plan_env(names: list[str]) -> dict[str, str | None]:
    """--env NAME (its value in this environment, None when unset) and NAME=VALUE (that value), in order."""
    env: dict[str, str | None] = {}
    for item in names:
        name, sep, value = item.partition("=")
        env[name] = value if sep else os.environ.get(name)
    return env
