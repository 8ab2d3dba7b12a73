"""Check a recipe launch before it starts: patched verl tree, Hydra overrides, verl's own config checks,
model, data, NPU.

The launchers call this (`python3 -m ascend_rl preflight`, ascend_rl/cli/preflight.py) with the full override list
they are about to hand to `python3 -m verl.trainer.main_ppo`; the command resolves the recipe and its base once
(`manifest.resolve_launch`) and hands the `Launch` to the checks. It plans the launch's verl tree (fetch, then the
patch series, through ascend_rl/overlay.py) without writing to it: when the tree lacks patches, the checks read a
patched copy in a scratch folder. It composes the overrides with Hydra against that tree's own
`verl/trainer/config` in struct mode (a misspelt key is rejected with the nearest real keys), runs the tree's own
`validate_config` on the composed config (what verl's TaskRunner asserts once Ray is up), then checks what only
the real machine has. Only when every check passed does a launch write: the series onto the tree, the recipe's
tokenizer config into the model folder. `--dry-run` writes nothing but the download cache (the pinned verl sdist
when the tree is absent and the sdist is not cached yet; its report says so): it treats the NPU, and a model or data
folder the launcher defaulted to and this machine lacks, as warnings (a model or data path named for the launch that
is not there, and a data file verl cannot train on, fail it as they fail a launch), says what a real launch would
change, and prints the command line; with `--json` it prints the
*plan* instead, one JSON object on stdout (the report goes to stderr): what a tool reading the launch needs, as
data (see `launch_plan`).

The package, one module a seam: `report` (a Check, PreflightError, which checks need the real machine), `tree`
(the launch's verl tree: planned, then made ready), `config` (Hydra composition, value types, verl's
validate_config), `settings` (nodes, layout, group, LoRA, the rollout's token budget), `reward` (the reward
manager registry and the reward function), `machine` (NPU or vLLM's CPU build, model, data, loggers, the
tokenizer), `memory` (the per-die plan) and `plan` (key settings, the command, the JSON plan).
"""

from __future__ import annotations

from ascend_rl.preflight.config import (
    TRAINER_CONFIGS,
    check_override_types,
    check_verl_config,
    compose,
    config_keys,
    missing_values,
    nearest_keys,
)
from ascend_rl.preflight.machine import (
    COLUMN_ROLES,
    LOGGER_MODULES,
    NPU_DEVICE_GLOB,
    check_cpu_runtime,
    check_data,
    check_logger,
    check_model,
    check_npu,
    data_columns,
    data_file_rows,
    install_tokenizer,
    may_be_absent,
)
from ascend_rl.preflight.memory import MEMORY_OVERRIDE, check_memory
from ascend_rl.preflight.plan import (
    KEY_FACTS,
    final_overrides,
    key_facts,
    launch_plan,
    plan_env,
    resolved_overrides,
    trainer_argv,
    trainer_command,
)
from ascend_rl.preflight.report import MACHINE_CHECKS, Check, PreflightError, dry_run_view
from ascend_rl.preflight.reward import (
    REWARD_CALL,
    REWARD_LOADER,
    REWARD_REGISTRIES,
    RewardRegistry,
    check_reward,
    check_reward_manager,
    reward_function_problem,
    reward_manager_setting,
    reward_registry,
)
from ascend_rl.preflight.settings import (
    GROUP_ESTIMATORS,
    TOKEN_BUDGET_MODULE,
    check_group,
    check_layout,
    check_lora,
    check_nodes,
    check_rollout_budget,
)
from ascend_rl.preflight.tree import TreePlan, plan_tree, prepare_tree

__all__ = [
    "GROUP_ESTIMATORS",
    "KEY_FACTS",
    "LOGGER_MODULES",
    "MACHINE_CHECKS",
    "MEMORY_OVERRIDE",
    "NPU_DEVICE_GLOB",
    "REWARD_CALL",
    "REWARD_LOADER",
    "REWARD_REGISTRIES",
    "TOKEN_BUDGET_MODULE",
    "TRAINER_CONFIGS",
    "COLUMN_ROLES",
    "Check",
    "PreflightError",
    "RewardRegistry",
    "TreePlan",
    "check_cpu_runtime",
    "check_data",
    "check_group",
    "check_layout",
    "check_logger",
    "check_lora",
    "check_memory",
    "check_model",
    "check_nodes",
    "check_npu",
    "check_override_types",
    "check_reward",
    "check_reward_manager",
    "check_rollout_budget",
    "check_verl_config",
    "compose",
    "config_keys",
    "dry_run_view",
    "data_columns",
    "data_file_rows",
    "final_overrides",
    "install_tokenizer",
    "key_facts",
    "launch_plan",
    "may_be_absent",
    "missing_values",
    "nearest_keys",
    "plan_env",
    "plan_tree",
    "prepare_tree",
    "resolved_overrides",
    "reward_function_problem",
    "reward_manager_setting",
    "reward_registry",
    "trainer_argv",
    "trainer_command",
]
