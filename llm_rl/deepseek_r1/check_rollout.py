#!/usr/bin/env python3
"""Build the DeepSeek recipe's vLLM rollout with its launcher's settings on CPU and check its weight sync.

With the e2e environment's Python (vLLM 0.13.0's CPU build; scripts/setup_e2e.sh --print names it):

    .venv-e2e/bin/python -m llm_rl.deepseek_r1.check_rollout --work /tmp/dsr1-rollout

What it does, in two processes: this one builds the trees, the checkpoint and the launcher's overrides, then starts
the engine's process (this module with --engine) with the tree on PYTHONPATH, where verl, vLLM and the rollout run
on a gloo group of one:
1. a tiny DeepSeek-V3 checkpoint (ascend_rl/tiny/deepseek_v3.py); verl 0.6.0 from the pinned sdist;
2. the launcher's own overrides, read from `run_deepseek_r1_a3.sh --variant real --dry-run` on a tree with the
   DeepSeek series applied (a dry run writes nothing; it composes them against its ppo_megatron_trainer); then the few that
   one CPU process needs (CPU_OVERRIDES below, each with its reason), composed against the same tree. Nothing
   of the CPU overlay (patches/cpu/) is needed on this path; `--with cpu` builds from the series + overlay;
3. verl's vLLMRollout built from that config as the Megatron worker builds it (chunked prefill,
   max_num_batched_tokens 1024 < max_model_len 4096, explicit offload, eager, dummy load format), then
   released as the worker's trainer_mode does; and the same construction from the series without
   the token-budget patch (the one adding verl/utils/vllm/token_budget.py, now ds-0007), which must raise;
4. rounds in the worker's rollout_mode order (resume weights, update_weights, resume kv_cache), greedy
   generation of prompts that together exceed the token budget (the scheduler's steps are recorded),
   trainer_mode's release; each round's tokens and log-probs are compared with the Hugging Face model holding
   the weights the trainer has:
     initial       sync the checkpoint's weights A (vLLM starts from dummy weights)       must match HF(A)
     no-sync       the trainer moves to B, no update_weights (the negative control)      must NOT match HF(B)
     no-experts    update_weights with B minus the routed experts (control)              must NOT match HF(B)
     synced        update_weights with all of B                                          must match HF(B)
   and in each round which of A's and B's tensors the engine's parameters hold exactly.
Taken away one at a time, the CPU settings fail as follows (vLLM 0.13.0 CPU build, 2026-12-01): without
VLLM_MLA_DISABLE the engine raises "MLA is not supported on CPU"; without custom_ops=["none"] 2 of 64 greedy
tokens match HF (log-prob gap 0.37); without the router keys in config.json the first sync raises KeyError on
e_score_correction_bias; in bf16 (the launcher's dtype) 63-64 of 64 tokens match, log-prob gap up to 0.05.
Writes WORK/result.json; exit status 0 when every check holds, 1 otherwise, 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ascend_rl.paths import REPO

LAUNCHER = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"
# the token-budget patch is the one that adds this file (found by content, so a renamed patch is still found)
BUDGET_MODULE = "verl/utils/vllm/token_budget.py"

# What one CPU process needs on top of the launcher's overrides; they come after them, so they win.
CPU_OVERRIDES = [
    # one process: no TP, no vLLM DP (the launcher's TP2 x DP64 = EP128 needs 128 ranks)
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.data_parallel_size=1",
    "actor_rollout_ref.rollout.expert_parallel_size=1",
    # fp32 so that vLLM and Hugging Face agree to rounding and greedy tokens can be compared one for one
    "actor_rollout_ref.rollout.dtype=float32",
    # vLLM's log-probs of the tokens it samples, compared with Hugging Face's
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    # vLLM's CPU custom ops (rms_norm among them) disagree with Hugging Face on this model; the native ops agree
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config={custom_ops:[none]}",
]
# Set before vllm is imported. The CPU platform refuses MLA (the attention runs unabsorbed, so vLLM-Ascend's
# MLA W_UV / W_UK_T cannot be exercised here: tests/deepseek_r1/test_vllm_ascend_contract.py and
# tests/deepseek_r1/test_deepseek_weight_sync.py cover them); the engine runs in this process (verl's update_weights reaches
# its model through llm_engine.model_executor); 1 GiB of KV cache instead of the CPU default of about 12.
ENGINE_ENV = {
    "VLLM_MLA_DISABLE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# prompts of these lengths (tokens) add up to more than max_num_batched_tokens (1024), so the scheduler
# prefills them in chunks; each then gets GEN_TOKENS greedy tokens
PROMPT_LENGTHS = (700, 400, 120, 24)
GEN_TOKENS = 16
# fp32 on both sides: rounding left a log-prob gap of 5e-7 here; stale tensors left 0.4 to 1.1
LOGPROB_TOL = 1e-3
EXPERTS = ".mlp.experts."


class CheckError(Exception):
    """A step failed; one line saying which and why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, required=True, help="folder for the trees, the checkpoint, result.json"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the tiny checkpoint (default: %(default)s)"
    )
    parser.add_argument(
        "--with",
        dest="with_overlay",
        metavar="OVERLAY",
        help="build the rollout from the DeepSeek series plus this overlay (cpu: patches/cpu/) "
        "instead of the launcher's own tree",
    )
    # the engine's process: started by run() with the tree on PYTHONPATH, reads and writes WORK/engine_*.json
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --- trees, checkpoint, config ---------------------------------------------------------------------------------


def prepare_trees(work: Path, with_overlay: str | None) -> tuple[Path, Path | None, Path]:
    """verl trees from the sdist: (the launcher's, with the DeepSeek series as a real launch applies it; with
    `with_overlay`, the series plus that overlay, else None; the series without the token-budget patch)."""
    from ascend_rl import artifacts, overlay

    # verl 0.6.0, named: this check's stack is its (megatron-core 0.12.1, vLLM 0.13), not the default base's
    recipe = overlay.load_recipe("deepseek_r1", "0.6.0")
    without_budget = dataclasses.replace(
        recipe,
        series=tuple(
            p
            for p in recipe.series
            if not any(
                fp.old_path is None and fp.path == BUDGET_MODULE for fp in overlay.patchset.parse(p).files
            )
        ),
    )
    if len(without_budget.series) != len(recipe.series) - 1:
        raise CheckError(f"no single patch of the DeepSeek series adds {BUDGET_MODULE}; update BUDGET_MODULE")
    wanted = [("launcher", recipe, True), ("without-token-budget", without_budget, True)]
    if with_overlay:
        wanted.append((f"with-{with_overlay}", overlay.with_overlay(recipe, with_overlay), True))
    trees = {}
    try:
        for name, series, patched in wanted:
            trees[name] = overlay.materialise(series, work / name, patched=patched, log=lambda msg: None)
    except artifacts.DownloadError as exc:
        raise CheckError(f"the verl {recipe.version} sdist cannot be fetched: {exc}") from None
    return trees["launcher"], trees.get(f"with-{with_overlay}"), trees["without-token-budget"]


def launcher_overrides(dry_run_tree: Path, model_dir: Path, work: Path) -> list[str]:
    """The overrides `run_deepseek_r1_a3.sh --variant real` passes to main_ppo, from its dry run's JSON plan."""
    env = dict(os.environ)
    env.update(
        PYTHON=sys.executable,
        VERL_BASE="0.6.0",  # the base of the trees prepare_trees built (this check's stack)
        VERL_DIR=str(dry_run_tree),
        MODEL_DIR=str(model_dir),
        LOG_DIR=str(work / "run_log"),
        CKPT_DIR=str(work / "ckpt"),
    )
    proc = subprocess.run(
        ["bash", str(LAUNCHER), "--variant", "real", "--dry-run", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if proc.returncode != 0:
        raise CheckError(
            f"the launcher's dry run failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    try:
        plan = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise CheckError(
            f"the launcher's dry run printed no JSON plan: {proc.stdout.strip()[-300:]}"
        ) from None
    if plan["config_name"] != "ppo_megatron_trainer":
        raise CheckError(f"the launcher composes {plan['config_name']}, not ppo_megatron_trainer")
    return plan["override_args"]


def compose(tree: Path, overrides: list[str]):
    from ascend_rl import preflight

    try:
        return preflight.compose(tree, "ppo_megatron_trainer", overrides)
    except preflight.PreflightError as exc:
        raise CheckError(str(exc)) from None


# --- the rollout -----------------------------------------------------------------------------------------------


def init_process_group() -> None:
    """A gloo group of one, with the env:// variables vLLM's external launcher reads."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")


def rollout_parts(cfg):
    """RolloutConfig, HFModelConfig and the rollout device mesh, as ActorRolloutRefWorker._build_rollout makes them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.rollout_mesh import rollout_mesh_shape
    from verl.workers.config import HFModelConfig

    rollout_cfg = cfg.actor_rollout_ref.rollout
    rollout_config = omega_conf_to_dataclass(rollout_cfg)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    shape = rollout_mesh_shape(
        dist.get_world_size(),
        rollout_cfg.tensor_model_parallel_size,
        rollout_cfg.data_parallel_size,
        rollout_cfg.pipeline_model_parallel_size,
        split_dp=rollout_cfg.name == "vllm" and rollout_cfg.mode == "sync",
    )
    mesh = init_device_mesh("cpu", mesh_shape=shape, mesh_dim_names=["dp", "infer_tp", "infer_pp"])
    return rollout_config, model_config, mesh


def budget_refusal_without_patch(tree: Path, parts) -> str:
    """Build vLLMRollout from the vllm_rollout_spmd.py of the series without the token-budget patch; returns the
    ValueError it raises."""
    import importlib.util

    path = tree / "verl" / "workers" / "rollout" / "vllm_rollout" / "vllm_rollout_spmd.py"
    spec = importlib.util.spec_from_file_location("spmd_without_token_budget", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.vLLMRollout(*parts)
    except ValueError as exc:
        return str(exc)
    raise CheckError(
        "without the token-budget patch the rollout was built with the launcher's budget; the control is void"
    )


def prompts_batch(tokenizer, lengths: tuple[int, ...]):
    """Left-padded prompts of the given token lengths, cut from the bundled problems' text, as a DataProto."""
    import torch
    from verl import DataProto

    from ascend_rl.tiny import qwen2 as tiny_qwen2

    ids = []
    for text in tiny_qwen2.bundled_texts():
        ids += tokenizer(text + "\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= sum(lengths):
            break
    if len(ids) < sum(lengths):
        raise CheckError(f"the bundled text has {len(ids)} tokens, fewer than {sum(lengths)}")
    prompts, start = [], 0
    for n in lengths:
        prompts.append(ids[start : start + n])
        start += n
    width = max(lengths)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids},
        meta_info={"eos_token_id": tokenizer.eos_token_id, "do_sample": False},
    )
    return batch, prompts


def engine_model(rollout):
    return rollout.inference_engine.llm_engine.model_executor.driver_worker.worker.model_runner.model


def tensors_held(model, weights: dict) -> int:
    """How many of `weights` the engine's parameters hold exactly. vLLM fuses tensors (q_a with kv_a, gate with
    up), stacks the experts and pads the vocabulary, so each tensor is looked for as a run of whole rows of a
    parameter with the same row width."""
    import torch

    params = [p.detach() for p in model.parameters()]
    held = 0
    for tensor in weights.values():
        rows = tensor.reshape(-1, tensor.shape[-1])
        for param in params:
            if param.shape[-1] != rows.shape[1] or param.numel() < tensor.numel():
                continue
            flat = param.reshape(-1, rows.shape[1])
            starts = torch.nonzero((flat == rows[0]).all(dim=1)).flatten().tolist()
            if any(torch.equal(flat[i : i + len(rows)], rows) for i in starts if i + len(rows) <= len(flat)):
                held += 1
                break
    return held


def engine_settings(rollout) -> dict:
    """What the engine was built with, read back from vLLM's own config."""
    config = rollout.inference_engine.llm_engine.vllm_config
    return {
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
        "max_model_len": config.model_config.max_model_len,
        "enforce_eager": config.model_config.enforce_eager,
        "enable_sleep_mode": config.model_config.enable_sleep_mode,
        "custom_ops": list(config.compilation_config.custom_ops),
        "additional_config": dict(config.additional_config),
        "dtype": str(config.model_config.dtype),
    }


def ascend_layers(model) -> int | None:
    """How many layers patch ds-0008's sync would transform (None on a tree without ds-0008)."""
    try:
        from verl.utils.vllm.ascend_weight_sync import ascend_attention_layers, ascend_moe_layers
    except ModuleNotFoundError:
        return None
    return len(ascend_moe_layers(model)) + len(ascend_attention_layers(model))


def record_scheduled_tokens(rollout) -> list[int]:
    """The tokens vLLM's scheduler puts in each engine step from now on (appended to the returned list)."""
    scheduler = rollout.inference_engine.llm_engine.engine_core.engine_core.scheduler
    steps: list[int] = []
    schedule = scheduler.schedule

    def recording(*args, **kwargs):
        out = schedule(*args, **kwargs)
        steps.append(out.total_num_scheduled_tokens)
        return out

    scheduler.schedule = recording
    return steps


def rollout_round(rollout, batch, weights: dict | None) -> tuple[list[list[int]], list[list[float]]]:
    """The Megatron worker's rollout_mode (resume weights, update_weights, resume kv_cache), a greedy generation,
    then trainer_mode's release; `weights` None skips update_weights."""

    async def go():
        await rollout.resume(tags=["weights"])
        if weights is not None:
            await rollout.update_weights(iter(weights.items()))
        await rollout.resume(tags=["kv_cache"])
        with rollout.update_sampling_params(max_tokens=GEN_TOKENS, ignore_eos=True):
            out = rollout.generate_sequences(batch)
        return out

    out = asyncio.run(go())
    tokens = out.batch["responses"][:, :GEN_TOKENS].tolist()
    logprobs = out.batch["rollout_log_probs"][:, :GEN_TOKENS].tolist()
    return tokens, logprobs


def release(rollout) -> None:
    asyncio.run(rollout.release())


def resident_bytes(rollout) -> dict[str, int]:
    """Bytes held by the engine's weight and KV-cache storages (each storage once)."""
    from verl.utils.explicit_offload import kv_cache_tensors, model_tensors

    worker = rollout.inference_engine.llm_engine.model_executor.driver_worker.worker
    held = {}
    for name, tensors in (
        ("weights", model_tensors(worker.model_runner.model)),
        ("kv_cache", kv_cache_tensors(worker.model_runner)),
    ):
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        held[name] = sum(storages.values())
    return held


# --- the Hugging Face reference --------------------------------------------------------------------------------


def hf_reference(hf_model, prompts: list[list[int]], vllm_tokens: list[list[int]]):
    """HF's greedy tokens for each prompt and its log-probs of vLLM's tokens (teacher-forced)."""
    import torch

    greedy, logprobs = [], []
    with torch.no_grad():
        for prompt, theirs in zip(prompts, vllm_tokens, strict=True):
            ids = torch.tensor([prompt])
            out = hf_model(ids, use_cache=True)
            past, picked = out.past_key_values, []
            for _ in range(GEN_TOKENS):
                nxt = int(out.logits[0, -1].argmax())
                picked.append(nxt)
                out = hf_model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            greedy.append(picked)
            full = torch.tensor([prompt + theirs])
            logits = hf_model(full).logits[0, len(prompt) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(theirs)[:, None])[:, 0]
            logprobs.append(lp.tolist())
    return greedy, logprobs


def compare(vllm_out, hf_model, prompts) -> dict:
    tokens, lps = vllm_out
    hf_tokens, hf_lps = hf_reference(hf_model, prompts, tokens)
    equal = sum(a == b for t, h in zip(tokens, hf_tokens, strict=True) for a, b in zip(t, h, strict=True))
    gap = max(abs(a - b) for t, h in zip(lps, hf_lps, strict=True) for a, b in zip(t, h, strict=True))
    total = sum(len(t) for t in tokens)
    return {
        "tokens_equal": equal,
        "tokens": total,
        "max_logprob_gap": gap,
        "match": equal == total and gap <= LOGPROB_TOL,
    }


def moved_weights(weights: dict, seed: int) -> dict:
    """The trainer's next weights: every tensor moved by noise of its own scale (norms and router bias included)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    moved = {}
    for name, w in weights.items():
        scale = float(w.std()) if w.numel() > 1 and float(w.std()) > 0 else 0.1
        moved[name] = w + scale * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    return moved


# --- main ------------------------------------------------------------------------------------------------------


ENGINE_INPUT, ENGINE_RESULT = "engine_input.json", "engine_result.json"


def run(args: argparse.Namespace) -> dict:
    """Trees, checkpoint and the launcher's overrides here; the rollout in the engine's process (check_engine())."""
    start = time.perf_counter()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(ENGINE_ENV)
    timings = {}
    launcher_tree, overlay_tree, without_budget = prepare_trees(work, args.with_overlay)
    from ascend_rl.tiny import deepseek_v3 as tiny_deepseek

    model_dir = work / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    tiny_deepseek.make_checkpoint(model_dir, seed=args.seed)
    timings["trees_and_checkpoint_s"] = time.perf_counter() - start

    launcher = launcher_overrides(launcher_tree, model_dir, work)
    timings["launcher_dry_run_s"] = time.perf_counter() - start - timings["trees_and_checkpoint_s"]
    # the launcher's tree (the NPU launch's, patched), or that series plus an overlay
    tree = overlay_tree or launcher_tree
    engine_input = {
        "tree": str(tree),
        "without_budget": str(without_budget),
        "model_dir": str(model_dir),
        "launcher": launcher,
        "seed": args.seed,
    }
    found = run_engine(work, tree, engine_input)
    timings.update(found.pop("timings"))
    usage = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return {
        "tree": tree.name,
        "settings": found["settings"],
        "engine": found["engine"],
        "launcher_overrides": launcher,
        "cpu_overrides": CPU_OVERRIDES,
        "refusal_without_budget_patch": found["refusal"],
        "tensors": found["tensors"],
        "expert_tensors": found["expert_tensors"],
        "prompt_lengths": list(PROMPT_LENGTHS),
        "gen_tokens": GEN_TOKENS,
        "rounds": found["rounds"],
        "checks": found["checks"],
        "ok": all(found["checks"].values()),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_rss_gib": round(usage / 2**20, 2),
    }


def run_engine(work: Path, tree: Path, engine_input: dict) -> dict:
    """This module with --engine in a process whose PYTHONPATH starts with the patched tree; what it found."""
    (work / ENGINE_INPUT).write_text(json.dumps(engine_input), encoding="utf-8")
    result = work / ENGINE_RESULT
    result.unlink(missing_ok=True)
    inherited = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(REPO), *([inherited] if inherited else [])]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "llm_rl.deepseek_r1.check_rollout", "--engine", "--work", str(work)],
        cwd=REPO,
        env=env,
        timeout=1800,
    )
    found = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else None
    if found is None:
        raise CheckError(
            f"the engine's process ended with exit {proc.returncode} and no result (its output is above)"
        )
    if "error" in found:
        raise CheckError(found["error"])
    return found


def check_engine(work: Path) -> dict:
    """verl's vLLMRollout from the tree this process runs with (PYTHONPATH), its rounds and the checks."""
    given = json.loads((work / ENGINE_INPUT).read_text(encoding="utf-8"))
    tree, without_budget = Path(given["tree"]), Path(given["without_budget"])
    model_dir, launcher, seed = Path(given["model_dir"]), given["launcher"], given["seed"]
    timings = {}
    overrides = [*launcher, *CPU_OVERRIDES]
    cfg = compose(tree, overrides)
    rollout_cfg = cfg.actor_rollout_ref.rollout
    settings = {
        key: rollout_cfg.get(key)
        for key in (
            "mode",
            "enable_chunked_prefill",
            "max_num_batched_tokens",
            "prompt_length",
            "response_length",
            "explicit_offload",
            "free_cache_engine",
            "enforce_eager",
            "load_format",
            "enable_prefix_caching",
        )
    }
    settings["additional_config"] = dict(rollout_cfg.engine_kwargs.vllm.additional_config or {})

    import torch
    import verl
    from transformers import AutoModelForCausalLM
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    if not Path(verl.__file__).resolve().is_relative_to(tree.resolve()):
        raise CheckError(f"verl comes from {verl.__file__}, not {tree}: put the tree first on PYTHONPATH")
    init_process_group()
    parts = rollout_parts(cfg)
    refusal = budget_refusal_without_patch(without_budget, parts)
    t0 = time.perf_counter()
    rollout = vLLMRollout(*parts)
    timings["rollout_build_s"] = time.perf_counter() - t0
    release(rollout)  # the worker's trainer_mode right after building a sync rollout

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    weights_a = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    weights_b = moved_weights(weights_a, seed + 1)
    batch, prompts = prompts_batch(parts[1].tokenizer, PROMPT_LENGTHS)
    model = engine_model(rollout)
    engine = engine_settings(rollout)
    # ds-0008's transforms apply to vLLM-Ascend's layers only: here update_weights is verl 0.6.0's load_weights
    engine["ascend_layers"] = ascend_layers(model)
    steps = record_scheduled_tokens(rollout)
    rounds = {}

    def do_round(name, sent, reference):
        t, first_step = time.perf_counter(), len(steps)
        out = rollout_round(rollout, batch, sent)
        hf.load_state_dict(reference)
        result = compare(out, hf, prompts)
        result["tensors_sent"] = 0 if sent is None else len(sent)
        # steps with more tokens than requests hold prefill (a decode step has one token per request)
        result["prefill_steps"] = [n for n in steps[first_step:] if n > len(PROMPT_LENGTHS)]
        # which weights the engine decoded with (looked up while resumed, before trainer_mode's release)
        result["engine_holds"] = {"A": tensors_held(model, weights_a), "B": tensors_held(model, weights_b)}
        result["resident_bytes"] = resident_bytes(rollout)
        release(rollout)
        # patch ds-0004: trainer_mode's release freed the weights and the KV cache (explicit offload)
        result["resident_bytes_released"] = resident_bytes(rollout)
        result["wall_s"] = round(time.perf_counter() - t, 1)
        rounds[name] = result
        print(f"check-deepseek-rollout: {name}: {json.dumps(result)}", flush=True)

    do_round("initial", weights_a, weights_a)
    do_round("no-sync", None, weights_b)
    no_experts = {k: v for k, v in weights_b.items() if EXPERTS not in k}
    do_round("no-experts", no_experts, weights_b)
    do_round("synced", weights_b, weights_b)

    n, experts = len(weights_a), sum(EXPERTS in k for k in weights_a)
    held = {name: (r["engine_holds"]["A"], r["engine_holds"]["B"]) for name, r in rounds.items()}
    budget = engine["max_num_batched_tokens"]
    checks = {
        "launcher settings reach the engine": settings["explicit_offload"] is True
        and rollout.explicit_offload is not None
        and settings["load_format"] == "dummy"
        and engine["enable_chunked_prefill"] is True
        and budget == settings["max_num_batched_tokens"] == 1024
        and engine["max_model_len"] == settings["prompt_length"] + settings["response_length"] == 4096
        and engine["enforce_eager"] is True
        and engine["enable_sleep_mode"] is False
        and engine["additional_config"] == settings["additional_config"],
        "without the token-budget patch the launcher's budget raises": "max_num_batched_tokens" in refusal,
        # the prompts' prefill took more than one step, none over the budget, the first one full
        "prompts prefilled in chunks of the budget": all(
            r["prefill_steps"][0] == budget
            and max(r["prefill_steps"]) <= budget
            and len(r["prefill_steps"]) > 1
            for r in rounds.values()
        ),
        "initial sync: engine holds all of A, matches HF(A)": rounds["initial"]["match"]
        and held["initial"][0] == n,
        # the offload/onload round trip without a sync gives back A bit for bit, and it is stale
        "no sync: engine still holds A, does not match HF(B)": not rounds["no-sync"]["match"]
        and held["no-sync"] == (n, 0),
        "experts withheld: engine holds B but A's experts, does not match HF(B)": not rounds["no-experts"][
            "match"
        ]
        and held["no-experts"] == (experts, n - experts),
        "full sync: engine holds all of B, matches HF(B)": rounds["synced"]["match"]
        and held["synced"] == (0, n),
        "explicit offload: release frees weights and KV cache": all(
            min(r["resident_bytes"].values()) > 0 and not any(r["resident_bytes_released"].values())
            for r in rounds.values()
        ),
    }
    return {
        "settings": settings,
        "engine": engine,
        "refusal": refusal,
        "tensors": n,
        "expert_tensors": experts,
        "rounds": rounds,
        "checks": checks,
        "timings": timings,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from importlib import metadata

        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        print(
            f"check-deepseek-rollout: error: {sys.executable} has no vLLM CPU build; run it with .venv-e2e/bin/python "
            "(make e2e-setup builds it)",
            file=sys.stderr,
        )
        return 1
    if args.engine:
        return engine_main(args.work.resolve())
    try:
        result = run(args)
    except CheckError as exc:
        print(f"check-deepseek-rollout: error: {exc}", file=sys.stderr)
        return 1
    (args.work / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, ok in result["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    print(
        f"check-deepseek-rollout: {result['wall_s']} s, peak memory {result['peak_rss_gib']} GiB; "
        f"wrote {args.work / 'result.json'}"
    )
    return 0 if result["ok"] else 1


def engine_main(work: Path) -> int:
    """The engine's process: WORK/engine_result.json holds what it found, or the one line that says why not."""
    os.environ.update(ENGINE_ENV)
    try:
        found = check_engine(work)
    except CheckError as exc:
        found = {"error": str(exc)}
    (work / ENGINE_RESULT).write_text(json.dumps(found), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
