"""The launch's Hydra config: composed against the tree's own trainer config, value types, verl's validate_config.

The overrides are composed in struct mode (a misspelt key is answered with the nearest real keys), their values
checked against the types of verl's defaults, and the tree's own validate_config run on the result in a child
Python."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ascend_rl.preflight.report import Check, PreflightError, one_line

TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")


def missing_values(cfg, prefix: str = "") -> list[str]:
    """Mandatory values (???) left unset, except in a section switched off by its own `enable: False` (verl
    0.7.1's reward.reward_model.rollout.name, say, which verl reads only with the reward model enabled)."""
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


GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def syntax_errors(overrides: list[str]) -> str | None:
    """One line naming the first override Hydra's grammar rejects, as the user wrote it (None: they all parse).
    Said before anything is composed: Hydra's own message names neither the override nor anything but the
    scratch copy of the config it was composing against."""
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as exc:
            why = one_line(exc).split("; See https://", 1)[0]
            hint = "key=value"
            if override.startswith("-"):
                hint = "an option goes before the overrides, and a launcher's options are listed by --help"
            elif re.search(r"[\[{]", override.partition("=")[2]):
                hint = "a list or mapping value closes its brackets, and the whole override is quoted for the shell"
            return f"{override}: not a valid Hydra override ({why}); want {hint} ({GRAMMAR})"
    return None


def compose(verl_dir: Path, config_name: str, overrides: list[str], resolve: bool = True):
    """Compose `overrides` against the tree's own trainer config (struct mode), fully resolved unless told."""
    config_dir = verl_dir / "verl" / "trainer" / "config"
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise PreflightError(f"{config_dir}/{config_name}.yaml not found; is {verl_dir} a verl tree?")
    if bad := syntax_errors(overrides):
        raise PreflightError(bad)
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
        message = one_line(exc)
        cause = f" ({one_line(exc.__cause__)})" if exc.__cause__ else ""
        unknown = re.search(r"Could not override '([^']+)'", message)
        if unknown and "not in struct" in message + cause and overrides:
            raise PreflightError(
                _unknown_key_message(verl_dir, config_name, overrides, unknown.group(1))
            ) from None
        raise PreflightError(
            f"Hydra rejected the overrides: {message}{cause}; "
            f"fix the key against verl's {config_name} config (verl/trainer/config/{config_name}.yaml in the verl "
            "tree), or prefix a new key with '+'"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def config_keys(cfg) -> list[str]:
    """Every dotted key of a composed config, mappings and their leaves, in the config's order."""
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
    # verl_dir is often the preflight's scratch copy, gone when the line is read: the file by its place in any tree
    where = f"verl/trainer/config/{config_name}.yaml in the verl tree"
    said = f"{given}: verl's {config_name} config has no key {key}"
    if key.isupper() and "." not in key:
        said += f" ({key} looks like one of the launcher's environment variables: set it before the command, {given} bash ...)"
    if near:
        return f"{said}; did you mean {' or '.join(near)}?"
    return f"{said}; fix the key against {where}, or prefix a key verl does not know with '+' to add it"


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
        verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, ValueError):
        tail = one_line("\n".join(proc.stderr.splitlines()[-3:])) if "proc" in locals() else "timed out"
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
            f"verl refuses the config ({err['where']}, {err['type']}): {one_line(err['message'])}; fix the "
            "overrides (NPUS, NNODES and the launcher's other variables end up there too)",
        )
    return Check("validate", "ok", "verl's validate_config passes (verl/utils/config.py)")
