"""The launch's reward: a reward manager the tree's trainer registers, a reward file with the named function.

The registry is read from the tree's source (nothing imported); the reward file is loaded without writing its
bytecode, and its function's signature bound to the arguments the configured manager passes."""

from __future__ import annotations

import ast
import difflib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from ascend_rl.paths import REPO
from ascend_rl.preflight.report import Check, load_file, one_line


def reward_manager_setting(cfg) -> tuple[str, str, str]:
    """(the key that names it, the reward manager's name, its source: register or importlib), as the tree's
    trainer reads them. verl 0.6.0 looks up reward_model.reward_manager (verl/trainer/ppo/reward.py:125-126);
    verl 0.7.1 looks up reward.reward_manager.name by reward.reward_manager.source, which
    reward_model.reward_manager and reward_model.reward_loop_source override when set
    (migrate_legacy_reward_impl, verl/experimental/reward_loop/reward_loop.py:49-54)."""
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
    if file.suffix != ".py":
        return (
            "load",
            f"{file} cannot be loaded as a Python module; custom_reward_function.path must name a .py file",
        )
    try:
        module = load_file(file, f"_preflight_reward_{abs(hash(str(file)))}")
    except Exception as exc:  # the user's file: any error it raises is reported, not re-raised
        return (
            "load",
            f"{file} fails to load ({type(exc).__name__}: {one_line(exc)}); fix the file or its imports",
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
