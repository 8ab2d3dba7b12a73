"""Build every rank class of a launch's Megatron training layout on this CPU and compare it with the memory plan.

    bash llm_rl/deepseek_r1/run_deepseek_r1_a3.sh --json > plan.json
    python3 -m ascend_rl shape_check --plan plan.json
    python3 -m ascend_rl shape_check --recipe deepseek_r1 [--base 0.7.1] [-- hydra.override=value ...]

For a dry run's JSON plan (or the launcher's, run here with --json), each distinct rank of the training layout -- the
first rank of every PP stage, as the actor (in megatron-core's DDP) and as the reference (no DDP) -- is built through
the base's own model-building path, one process per rank, with torch.distributed's fake backend at the launch's
world size and the meta device (ascend_rl/harness/fake_ranks.py; no weights, a few seconds a rank). Per rank it
prints the decoder layers, dense and expert parameter bytes, and the DDP buffers' weight and gradient bytes and the
distributed optimizer's part that follow from the launch's precision settings; then whether each equals the memory
plan's figure for that rank (ascend_rl/memory_plan.py, planned with megatron-core's local layer spec, the one a CPU
builds; the NPU plan's TransformerEngine spec differs by MLA's whole down-projections, shown). Megatron's own
refusal of a layout is printed in its own words, with the setting that fixes it (ascend_rl/megatron_layout.py).

The rollout's weights per rank are the plan's, from vLLM's weight loaders' shard rules (memory_plan's
rollout weights term; not built: vLLM's model classes need its engine's distributed state).

Bases: verl 0.9.1 (Megatron-Bridge's provider from the HF config, as its engine builds it, in .venv-e2e-091);
verl 0.6.0 / 0.7.1 (megatron-core 0.12.1 through verl's Megatron worker with use_mbridge=False: verl's
hf_to_mcore_config, then get_model with init_mcore_model, in the e2e environment .venv-e2e). Results are cached in
the download cache by a key of the build's inputs (config, layout, settings, the builder's and megatron's sources);
--no-cache builds again.

An FSDP2 launch on verl 0.9.1 (actor.strategy=fsdp2) is handed to shape_check_fsdp.py: every rank built by verl's
own apply_fsdp2 on the meta device (fake_fsdp.py) and compared with memory_plan's per-rank FSDP2 figures. FSDP1
(actor.strategy=fsdp, the Qwen launchers' default) is refused in one line: not built.

Exit status: 0 every rank class built and equal to the plan; 1 refused by megatron-core, or a figure differs; 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascend_rl import artifacts, manifest, megatron_layout
from ascend_rl import memory_plan as mp
from ascend_rl.paths import REPO

HERE = Path(__file__).resolve().parent
OTC_PREFIX = "actor_rollout_ref.actor.megatron.override_transformer_config."
DDP_PREFIX = "actor_rollout_ref.actor.megatron.override_ddp_config."
MEG = "actor_rollout_ref.actor.megatron."
# the bases whose model-building path the builder knows (fake_ranks.py): verl 0.9.1's engine (Megatron-Bridge,
# megatron-core 0.16.1), verl 0.6.0 / 0.7.1's Megatron worker (verl's converter, megatron-core 0.12.1)
BUILT_BASES = ("0.9.1", "0.7.1", "0.6.0")
ENGINE_BASES = ("0.9.1",)
# the environment the worker bases build in: the e2e environment (torch 2.9.1, the constraints.txt stack)
WORKER_ENV = REPO / ".venv-e2e"
# an HF architectures entry for the model types the plan ships (AutoConfig needs model_type only)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class ShapeCheckError(Exception):
    """One line: what the check cannot do, and why."""


@dataclass(frozen=True)
class Target:
    """What the build needs: the launch's settings, the model config, the base and recipe."""

    settings: dict[str, Any]
    model: dict[str, Any]
    base: str
    recipe: str


def target_from_plan(plan: dict) -> Target:
    """The launch of a dry run's JSON plan."""
    settings = mp.settings_from_plan(plan)
    base = str((plan.get("verl") or {}).get("version") or "")
    strategy = str(settings["actor_rollout_ref.actor.strategy"])
    if strategy == "fsdp":
        raise ShapeCheckError(
            "the launch's actor is FSDP1 (actor.strategy=fsdp: verl's engine wraps it in FullyShardedDataParallel's "
            "flat parameters), which the check does not build; it builds FSDP2 (actor_rollout_ref.actor.strategy="
            "fsdp2) and Megatron launches"
        )
    if strategy == "fsdp2" and base not in ENGINE_BASES:
        raise ShapeCheckError(
            f"the check builds FSDP2 as verl {', '.join(ENGINE_BASES)}'s FSDP engine shards it, not verl {base}'s "
            "legacy workers (their shard_placement_fn); memory_plan's fsdp2_shards plans them"
        )
    try:
        model, _ = mp.model_config(settings.get("actor_rollout_ref.model.path"))
    except ValueError as exc:
        raise ShapeCheckError(str(exc)) from None
    return Target(settings, dict(model), base, str(plan.get("recipe") or ""))


def launch_spec(t: Target, model_dir: Path, ranks: list[tuple[int, str]], jobs: int) -> dict:
    """The builder's input (fake_ranks.py): the Megatron sizes and the overrides verl hands the provider."""
    s = t.settings
    world = int(s["trainer.nnodes"]) * int(s["trainer.n_gpus_per_node"])
    otc = {
        k[len(OTC_PREFIX) :]: v
        for k, v in s.items()
        if k.startswith(OTC_PREFIX) and v not in (None, "", "null")
    }
    from ascend_rl.harness import fake_megatron

    ddp = {k[len(DDP_PREFIX) :]: v for k, v in s.items() if k.startswith(DDP_PREFIX) and v is not None}
    return {
        "model_dir": str(model_dir),
        "world": world,
        "tp": int(s[MEG + "tensor_model_parallel_size"]),
        "pp": int(s[MEG + "pipeline_model_parallel_size"]),
        "ep": int(s[MEG + "expert_model_parallel_size"]),
        "etp": int(s.get(MEG + "expert_tensor_parallel_size") or 1),
        "cp": 1,
        "vpp": None,
        "sequence_parallel": bool(s.get(MEG + "sequence_parallel", True)),
        "dtype": str(s.get(MEG + "dtype") or "bfloat16"),
        "use_distributed_optimizer": bool(s[MEG + "use_distributed_optimizer"]),
        "override_transformer_config": fake_megatron.build_overrides(otc),
        "override_ddp_config": ddp,
        "ranks": [list(r) for r in ranks],
        "jobs": jobs,
        **_worker_spec(t),
    }


def _worker_spec(t: Target) -> dict:
    """What verl 0.6.0 / 0.7.1's worker path reads beyond the engine's (nothing for 0.9.1: its key stays as it was):
    the base, and the router frozen by the launch's model.override_config.moe_config (make_megatron_module)."""
    if t.base in ENGINE_BASES:
        return {}
    freeze = t.settings.get("actor_rollout_ref.model.override_config.moe_config.freeze_moe_router")
    return {"builder": "worker", "base": t.base, "freeze_moe_router": str(freeze).lower() == "true"}


def rank_classes(t: Target) -> list[tuple[int, str]]:
    """The distinct ranks: the first rank of each PP stage (every rank of a stage holds the same shapes: TP and EP
    split evenly), as the actor and as the reference."""
    s = t.settings
    world = int(s["trainer.nnodes"]) * int(s["trainer.n_gpus_per_node"])
    pp = int(s[MEG + "pipeline_model_parallel_size"])
    firsts = [stage * (world // pp) for stage in range(pp)]
    return [(r, "actor") for r in firsts] + [(r, "ref") for r in firsts]


# the HF class of the model types the recipes train, for a config (the plan's shipped table) that does not name it:
# Megatron-Bridge picks its bridge by it
ARCHITECTURES = {
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def write_model_dir(model: dict, root: Path) -> Path:
    """A folder holding the model's config.json (what AutoConfig and the bridge read; no weights)."""
    model = dict(model)
    if not model.get("architectures") and model.get("model_type") in ARCHITECTURES:
        model["architectures"] = [ARCHITECTURES[model["model_type"]]]
    text = json.dumps(model, indent=1, sort_keys=True)
    folder = root / f"model-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "config.json.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / "config.json")
    return folder


# ------------------------------------------------------------------------------------------------ the build


def _sources_digest(tree: Path, packages: Path, worker: bool = False) -> str:
    """What the build's result depends on besides its input: the builder, the CPU stand-ins, verl's engine (or, for
    the worker path, verl's converter and model initializer) and the Megatron packages (by their folder, which is
    keyed by their pins)."""
    h = hashlib.sha256(packages.name.encode())
    mcore = tree / "verl" / "models" / "mcore"
    for path in (
        HERE / "fake_ranks.py",
        HERE / "fake_megatron.py",
        tree / "verl" / "utils" / "megatron" / "cpu_compat.py",
        tree / "verl" / "workers" / "engine" / "megatron" / "transformer_impl.py",
        tree / "verl" / "utils" / "megatron_utils.py",
        *(
            (mcore / "config_converter.py", mcore / "model_initializer.py", mcore / "registry.py")
            if worker
            else ()
        ),
    ):
        h.update(path.read_bytes() if path.is_file() else b"-")
    return h.hexdigest()


# what the CPU tree of a recipe and base is made of: a change to any of these makes a new tree
_TREE_INPUTS = ("patches", "ascend_rl/harness/verl_modules", "ascend_rl/moe_reshard.py")


def cpu_tree(recipe: str, base: str) -> Path:
    """A verl tree of `base` with the recipe's series and the CPU overlay (what its CPU launch runs), in the
    download cache under a key of the patches and modules it is made of: made once (fetched from the pinned sdist,
    then patched, then renamed into place), never edited afterwards. The recipe's own verl-<base>-cpu folder is
    not used: a user's tree may hold edits or an older series."""
    from ascend_rl import locks

    h = hashlib.sha256()
    recipe_dir = REPO / "llm_rl" / recipe
    for top in (*(REPO / x for x in _TREE_INPUTS), recipe_dir / "patches", recipe_dir / "verl_modules",
                recipe_dir / "recipe.toml"):  # fmt: skip
        for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    root = artifacts.cache_dir() / "shape-check"
    tree = root / f"verl-{base}-{recipe}-cpu-{h.hexdigest()[:12]}"
    if (tree / ".recipes-ok").is_file():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    with locks.exclusive(root / "trees.lock"):
        if (tree / ".recipes-ok").is_file():
            return tree
        with tempfile.TemporaryDirectory(dir=root, prefix=".tree-") as tmp:
            work = Path(tmp) / "verl"
            common = [recipe, "--base", base, "--with", "cpu"]
            for args in (
                ["fetch", *common, "--source", "sdist", "--dest", str(work)],
                ["apply", *common, "--target", str(work)],
            ):
                proc = subprocess.run(
                    [sys.executable, "-m", "ascend_rl", "overlay", *args],
                    cwd=REPO, capture_output=True, text=True, timeout=900,
                )  # fmt: skip
                if proc.returncode != 0:
                    last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                    raise ShapeCheckError(f"the CPU verl tree cannot be made: overlay {args[0]}: {last[0]}")
            (work / ".recipes-ok").write_text(f"{recipe} {base} cpu\n")
            os.replace(work, tree)
    return tree


def build_inputs(t: Target) -> tuple[Path, Path, Path]:
    """(the cache folder, the model's config folder, the CPU verl tree) a build of `t` reads."""
    root = artifacts.cache_dir() / "shape-check"
    root.mkdir(parents=True, exist_ok=True)
    return root, write_model_dir(t.model, root), cpu_tree(t.recipe, t.base)


def build(t: Target, ranks: list[tuple[int, str]], jobs: int, use_cache: bool, log=print) -> dict:
    """fake_ranks.py's result for `ranks` (cached)."""
    from ascend_rl.harness.launch import HarnessError, base_python

    if t.base not in BUILT_BASES:
        raise ShapeCheckError(
            f"the builder knows verl {', '.join(BUILT_BASES)}'s model-building path, not {t.base}'s; its layout is "
            "checked by the rules only: python3 -m ascend_rl preflight's megatron line"
        )
    worker = t.base not in ENGINE_BASES
    if worker:
        python = WORKER_ENV / "bin" / "python"
        if not python.is_file():
            raise ShapeCheckError(
                f"verl {t.base}'s model is built in the e2e environment and {WORKER_ENV.name} is missing; make it "
                "with `bash scripts/setup_e2e.sh`"
            )
    else:
        try:
            python = base_python(t.base)
        except HarnessError as exc:
            raise ShapeCheckError(str(exc)) from None
    root, model_dir, tree = build_inputs(t)
    # the 0.6.0 / 0.7.1 stack is MEGATRON_STACKS[None] (constraints.txt: megatron-core 0.12.1)
    packages = artifacts.megatron_packages(python, None if worker else t.base)
    spec = launch_spec(t, model_dir, ranks, jobs)
    key = hashlib.sha256(
        json.dumps(spec, sort_keys=True).encode() + _sources_digest(tree, packages, worker).encode()
    ).hexdigest()[:16]
    cached = root / f"build-{key}.json"
    if use_cache and cached.is_file():
        log(f"shape_check: the build of these ranks is cached ({cached.name}; --no-cache builds again)")
        return json.loads(cached.read_text())
    env = dict(os.environ)
    env.update(dict(manifest.resolve_launch(t.recipe, t.base, profile="cpu").cpu_env or ()))
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(packages), str(REPO)])
    env.setdefault("OMP_NUM_THREADS", "1")
    log(f"shape_check: building {len(ranks)} ranks of verl {t.base}'s Megatron layout ({jobs} at a time)")
    return run_builder(python, "ascend_rl.harness.fake_ranks", spec, env, cached)


def run_builder(python: Path, module: str, spec: dict, env: dict, cached: Path) -> dict:
    """`python -m module SPEC OUT` (a builder: fake_ranks, fake_fsdp) in `env`; its result, written to `cached`."""
    with tempfile.TemporaryDirectory(prefix="shape-check-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(python), "-m", module, str(spec_path), str(out_path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0 or not out_path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ShapeCheckError(f"the builder failed (exit {proc.returncode}): {tail[0]}")
        result = json.loads(out_path.read_text())
    result["wall_s"] = round(time.monotonic() - t0, 1)
    tmp_cache = cached.with_suffix(".tmp")
    tmp_cache.write_text(json.dumps(result, indent=1))
    os.replace(tmp_cache, cached)
    return result


# ------------------------------------------------------------------------------------------------ the comparison


@dataclass(frozen=True)
class RankFigures:
    """One rank's bytes: weights (the DDP param buffer, or the parameters without DDP), gradients, optimizer."""

    rank: int
    role: str
    stage: int
    layers: int
    dense: int
    expert: int
    weights: int
    gradients: int
    optimizer: int


def _stage_ranks(t: Target, stage: int) -> list[tuple[int, int, int]]:
    """(global rank, DP rank, expert-DP rank) of each rank of `stage` (memory_plan.mcore_rank_groups' order)."""
    lay = mp._layout(t.settings)
    per = lay.world // lay.pp
    return [(r, *mp.mcore_rank_groups(r, lay)[1:]) for r in range(stage * per, (stage + 1) * per)]


def built_figures(t: Target, row: dict) -> dict[tuple[int, str], RankFigures]:
    """A built rank class's bytes under the launch's precision settings, for every rank of its stage: the buffers
    megatron-core made (their dtypes) and, per rank, the distributed optimizer's part of them (owned_by_dp_rank,
    at that rank's DP and expert-DP index) at the plan's bytes per value (memory_plan._megatron_state: fp32 main
    weights + Adam's m and v, 12 B, or 8 B with fp32 weights on verl 0.9.1's engine; 1/16 on the die with
    MindSpeed's swap_optimizer). The reference (no DDP): its parameters, on the class's rank."""
    s = t.settings
    lay = mp._layout(s)
    stage = int(row["rank"]) // (lay.world // lay.pp)
    common = (stage, row["layers"], row["dense"], row["expert"])
    if row["role"] != "actor":
        weights = int(row["dense_bytes"]) + int(row["expert_bytes"])
        return {(row["rank"], "ref"): RankFigures(row["rank"], "ref", *common, weights, 0, 0)}
    bufs = row["buffers"]
    weights = sum(b["numel"] * _DTYPE_BYTES[b["param_dtype"]] for b in bufs)
    grads = sum(b["numel"] * _DTYPE_BYTES[b["grad_dtype"]] for b in bufs)
    fp32 = all(b["param_dtype"] == "float32" for b in bufs)
    per_value = 8 if fp32 and mp.megatron_engine(s) else 12
    swap = 16 if bool(s.get(OTC_PREFIX + "swap_optimizer")) else 1
    distributed = bool(s[MEG + "use_distributed_optimizer"])
    out = {}
    for rank, dp_rank, edp_rank in _stage_ranks(t, stage):
        owned = 0
        for b in bufs:
            if not distributed:
                owned += b["params"]
            else:
                owned += b["owned_by_dp_rank"][dp_rank if b["kind"] == "dense" else edp_rank]
        out[(rank, "actor")] = RankFigures(rank, "actor", *common, weights, grads, per_value * owned // swap)
    return out


def planned_figures(
    t: Target, local_spec: bool = True, settings: dict | None = None
) -> dict[tuple[int, str], RankFigures]:
    """The memory plan's figures for the same ranks (`settings`: the launch's unless given): every rank of each
    stage as the actor, the stage's first as the reference."""
    s = dict(settings or t.settings)
    s["_mcore_spec"] = "local" if local_spec else "te"
    # the plan of a launch on an NPU die (the build does not depend on the device)
    s["trainer.device"] = "npu"
    plan = mp.plan_launch(s)
    stages = getattr(plan, "stage_plans", None) or [plan]
    sh = mp.shapes(t.model)
    lay = mp._layout(s)
    layout = megatron_layout.pipeline_split(s, sh.spec.num_layers)
    from ascend_rl import moe_reshard as mr

    train = mr.TrainLayout(lay.world, tp=lay.tp, ep=lay.ep, pp=lay.pp, layers_per_stage=layout)
    out = {}
    for stage, p in enumerate(stages):
        dense, expert = mp.mcore_params(sh, lay.tp, stage, train, local_spec=local_spec)
        common = (stage, layout[stage], sum(dense), sum(expert))
        ref_w = next(term.nbytes for ph in p.phases for term in ph.terms if term.name == "reference weights")
        first = stage * (lay.world // lay.pp)
        out[(first, "ref")] = RankFigures(first, "ref", *common, ref_w, 0, 0)
        for rank in range(first, first + lay.world // lay.pp):
            terms = p.rank_terms[rank]
            out[(rank, "actor")] = RankFigures(
                rank, "actor", *common, terms["weights"], terms["gradients"], terms["optimizer_states"]
            )
    return out


FIELDS = ("layers", "dense", "expert", "weights", "gradients", "optimizer")


def compare(
    built: dict[tuple[int, str], RankFigures], planned: dict[tuple[int, str], RankFigures]
) -> list[str]:
    """Each figure where the build and the plan differ, one line each; empty when they agree everywhere."""
    lines = []
    for key in sorted(built, key=lambda k: (k[1], k[0])):
        b, p = built[key], planned.get(key)
        if p is None:
            lines.append(f"{key[1]} rank {key[0]}: built, not planned")
            continue
        for field in FIELDS:
            if getattr(b, field) != getattr(p, field):
                lines.append(
                    f"{key[1]} rank {key[0]} (stage {b.stage}) {field}: built {getattr(b, field):,} != "
                    f"planned {getattr(p, field):,}"
                )
    return lines


def table(built: dict[tuple[int, str], RankFigures], planned_te: dict[tuple[int, str], RankFigures]) -> str:
    """One row per rank class (the first rank of each stage, actor and reference); the optimizer column gives the
    least and the most over the stage's ranks (the distributed optimizer's parts differ by DP rank)."""
    biggest = max(f.weights for f in built.values())
    unit, size = ("GiB", 1024**3) if biggest >= 1024**3 else ("MiB", 1024**2)
    head = f"{'role':<6}{'rank':>5}{'stage':>6}{'layers':>7}{'params (M)':>12}{'experts (M)':>12}"
    head += f"{'weights':>10}{'grads':>9}{'optimizer':>17}{'NPU-spec weights':>18}   ({unit})"
    rows = [head]
    classes = sorted({(f.stage, f.role) for f in built.values()}, key=lambda k: (k[1], k[0]))
    for stage, role in classes:
        members = [f for f in built.values() if f.stage == stage and f.role == role]
        b = min(members, key=lambda f: f.rank)
        lo, hi = min(f.optimizer for f in members), max(f.optimizer for f in members)
        optim = f"{lo / size:.2f}" if lo == hi else f"{lo / size:.2f}-{hi / size:.2f}"
        te = planned_te.get((b.rank, b.role))
        rows.append(
            f"{b.role:<6}{b.rank:>5}{b.stage:>6}{b.layers:>7}{b.dense / 1e6:>12.1f}{b.expert / 1e6:>12.1f}"
            f"{b.weights / size:>10.2f}{b.gradients / size:>9.2f}{optim:>17}"
            f"{(te.weights / size if te else 0):>18.2f}"
        )
    return "\n".join(rows)


def disagree(diffs: list[str], report: dict, log) -> bool:
    """Record the figures where the build and the plan differ; say each, and whether there were any."""
    report["differences"] = diffs
    for line in diffs:
        log(f"  differs: {line}")
    if diffs:
        log(f"shape_check: the build and the plan disagree on {len(diffs)} figures")
    return bool(diffs)


def rollout_line(t: Target) -> str:
    """The rollout's weights per rank: the plan's (vLLM's weight loaders' shard rules: memory_plan's rollout weights
    term), not built -- vLLM's model classes need its engine's distributed state and config."""
    s = dict(t.settings, **{"trainer.device": "npu"})
    plan = mp.plan_launch(s)
    term = next(
        x for ph in plan.phases if ph.name == "generation" for x in ph.terms if x.name == "rollout weights"
    )
    lay = mp._layout(s)
    return (
        f"rollout: {term.nbytes / 2**30:.2f} GiB of weights per rank at TP{lay.rollout_tp} EP{lay.rollout_ep} "
        f"({term.how}; from vLLM's weight loaders' shard rules as the plan applies them, not built)"
    )


def run(t: Target, jobs: int, use_cache: bool, log=print) -> tuple[int, dict]:
    """Check `t`: (exit status, report)."""
    if str(t.settings["actor_rollout_ref.actor.strategy"]) == "fsdp2":
        from ascend_rl.harness import shape_check_fsdp

        try:
            return shape_check_fsdp.run(t, jobs, use_cache, log)
        except shape_check_fsdp.ShapeCheckError as exc:  # this module's class when run as __main__
            raise ShapeCheckError(str(exc)) from None
    from ascend_rl.preflight.shape import shape_problem_check

    report: dict[str, Any] = {"base": t.base, "recipe": t.recipe}
    rule = shape_problem_check(t.settings, t.model)  # the dry run's megatron line: the rules, no build
    report["rule"] = rule.detail
    # a layout the rules refuse is built on one rank only: enough for megatron-core's own words
    ranks = rank_classes(t) if rule.status != "FAIL" else [(0, "actor")]
    result = build(t, ranks, jobs, use_cache, log)
    report["build"] = result
    errors = [r for r in result["ranks"] if "error" in r]
    if errors:
        first = errors[0]
        why = f"; the dry run says: {rule.detail}" if rule.status == "FAIL" else ""
        log(f"shape_check: megatron-core refuses the layout on rank {first['rank']}: {first['error']} "
            f"({first.get('where', '')}){why}")  # fmt: skip
        report["refused"] = first["error"]
        return 1, report
    if rule.status == "FAIL":
        log(f"shape_check: the dry run refuses what megatron-core built: {rule.detail} (a rule out of step)")
        return 1, report
    split = megatron_layout.pipeline_split(t.settings, int(t.model.get("num_hidden_layers") or 0))
    built = {key: fig for r in result["ranks"] for key, fig in built_figures(t, r).items()}
    planned = planned_figures(t, local_spec=True)
    te = planned_figures(t, local_spec=False)
    log(f"shape_check: {len(result['ranks'])} rank classes built ({len(built)} ranks' figures) in "
        f"{result.get('wall_s', 0)} s (imports {result.get('imports_s')} s) by megatron-core "
        f"{result.get('megatron_core', '?')}; split {list(split)}")  # fmt: skip
    log(table(built, te))
    log(rollout_line(t))
    if disagree(compare(built, planned), report, log):
        return 1, report
    delta = max(te[k].weights - planned[k].weights for k in planned if k[1] == "actor")
    log(
        "shape_check: every rank class built; its layers, parameters, weights, gradients and optimizer bytes equal "
        "the plan's (megatron-core's local layer spec)"
        + (
            f". The NPU plan (TransformerEngine spec: MLA's down-projections whole) holds {delta / 2**20:.1f} MiB "
            "more weights on the largest actor rank"
            if delta
            else ""
        )
    )
    return 0, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl shape_check",
        description="Build every rank class of a launch's Megatron layout on this CPU (fake backend, meta device) "
        "and compare it with the memory plan.",
        epilog="Exit status: 0 built and equal to the plan, 1 refused or different, 2 usage.",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", help="a launcher's --json dry-run plan (a file, or - for stdin)")
    src.add_argument("--recipe", help="run this recipe's launcher's dry run (--json) for the plan")
    parser.add_argument("--base", help="with --recipe: the verl base (default: the recipe's default)")
    parser.add_argument("--jobs", type=int, default=2, help="ranks built at a time (default 2)")
    parser.add_argument("--no-cache", action="store_true", help="build again even when the build is cached")
    parser.add_argument("--json", dest="json_out", help="also write the report as JSON to this file")
    parser.add_argument("overrides", nargs="*", help="with --recipe: Hydra overrides for the launcher")
    args = parser.parse_args(argv)
    try:
        plan = _read_plan(args)
        t = target_from_plan(plan)
        status, report = run(t, max(1, args.jobs), not args.no_cache)
    except (ShapeCheckError, megatron_layout.LayoutError, OSError, json.JSONDecodeError) as exc:
        print(f"shape_check: error: {exc}", file=sys.stderr)
        return 1
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return status


def _read_plan(args) -> dict:
    if args.plan:
        text = sys.stdin.read() if args.plan == "-" else Path(args.plan).read_text()
        return json.loads(text)
    from ascend_rl.harness.launch import DS_LAUNCHER, QWEN_LAUNCHER

    launcher = {"deepseek_r1": DS_LAUNCHER, "qwen2_5": QWEN_LAUNCHER}.get(args.recipe)
    if launcher is None:
        raise ShapeCheckError(f"no launcher known for recipe {args.recipe!r} (deepseek_r1, qwen2_5)")
    cmd = ["bash", str(launcher), "--json", *(["--base", args.base] if args.base else []), *args.overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ShapeCheckError(f"the launcher's dry run failed: {tail[0]}")
    return json.loads(proc.stdout)


if __name__ == "__main__":
    sys.exit(main())
