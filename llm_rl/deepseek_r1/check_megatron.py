#!/usr/bin/env python3
"""Run verl's Megatron actor on a tiny DeepSeek-V3 on CPU, two gloo processes, EP=2, and check it against HF.

With the e2e environment's Python (scripts/setup_e2e.sh --print names it):

    .venv-e2e/bin/python -m llm_rl.deepseek_r1.check_megatron --work /tmp/dsr1-megatron

What it does:
1. verl 0.6.0 from the pinned sdist with the DeepSeek series and the CPU overlay (patches/cpu/, whose
   cpu-0005 makes megatron-core 0.12.1 run on CPU); megatron-core and mbridge at the constraints.txt pins,
   installed --no-deps into a stamped folder of the download cache (artifacts.megatron_packages), put on
   PYTHONPATH of the two ranks only; a tiny DeepSeek-V3 checkpoint (ascend_rl/tiny/deepseek_v3.py);
2. the actor config composed against the tree's ppo_megatron_trainer (CONFIG_OVERRIDES: EP=2 on two ranks,
   fp32, the launcher's actor.recompute_old_log_prob=False and rollout.expert_reshard=alltoallv), normalised
   per data-parallel rank as ActorRolloutRefWorker.__init__ does;
3. on each rank, as ActorRolloutRefWorker.init_model builds it: hf_to_mcore_config, make_megatron_module
   (verl's init_mcore_model under Megatron's DDP), the Megatron distributed optimizer, MegatronPPOActor;
4. the weights exported by verl's per_tensor_generator (EP all-gather, the path without expert_reshard) are
   loaded into Hugging Face's DeepseekV3ForCausalLM (strict: every tensor named and shaped as HF's own);
   MegatronPPOActor.compute_log_prob on the rank's half of a batch must equal HF's log-probs of the same
   responses; HF holding the export with two routed experts swapped must not (the negative control);
5. one update by the worker's own ActorRolloutRefWorker.update_actor after the worker's offload (the launcher's
   param/grad/optimizer offload with explicit offload, ds-0004), without old_log_probs or a temperature in the
   batch (the skip, patch shared-0101's Megatron branch);
   the export must then differ from the first, and the actor's new log-probs must equal HF's with it;
6. the export with rollout.expert_reshard=alltoallv (patch ds-0006): every rank must receive, bit for bit,
   exactly the routed experts the rollout's EP rank keeps, and everything else as the all-gather export has it.
Writes WORK/result.json; exit 0 when every check holds, 1 otherwise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ascend_rl.paths import REPO

WORLD = 2
# The actor config: composed against the tree's ppo_megatron_trainer, as a launcher's overrides are.
CONFIG_OVERRIDES = [
    # two processes: the experts split over EP=2; attention and dense layers data-parallel (DP=2)
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
    # the DeepSeek launcher's: no old-log-prob pass (one mini-batch, one epoch) and the AlltoAllV reshard
    "actor_rollout_ref.actor.recompute_old_log_prob=False",
    "actor_rollout_ref.rollout.expert_reshard=alltoallv",
    # the rollout the reshard plans for: one vLLM engine per rank, EP=2 (TP1 x DP2)
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.data_parallel_size=2",
    "actor_rollout_ref.rollout.expert_parallel_size=2",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.rollout.name=vllm",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_epochs=1",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0",
    "actor_rollout_ref.actor.optim.total_training_steps=1",  # main_ppo fills it in; the LR scheduler needs it
    # the DeepSeek launcher's offload: actor parameters, gradients and optimizer off the device between phases,
    # with the rollout's explicit offload (patch ds-0004: update_actor then leaves the parameters resident)
    "actor_rollout_ref.actor.megatron.param_offload=True",
    "actor_rollout_ref.actor.megatron.grad_offload=True",
    "actor_rollout_ref.actor.megatron.optimizer_offload=True",
    "actor_rollout_ref.rollout.explicit_offload=True",
    # fp32 parameters and optimizer, so that Megatron and HF agree to rounding
    "+actor_rollout_ref.actor.optim.override_optimizer_config.bf16=False",
    "+actor_rollout_ref.actor.optim.override_optimizer_config.params_dtype=float32",
    # what verl's DeepSeek config converter sets and megatron-core has only with TE / apex on CPU
    "+actor_rollout_ref.actor.megatron.override_transformer_config.persist_layer_norm=False",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=False",
    "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=local",
    # the launcher's MoE dispatcher (the all-to-all whose split sizes cpu-0005 converts)
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=alltoall",
]
PROMPT_LEN, RESPONSE_LEN, PER_RANK = 12, 12, 4
# fp32 both sides; Megatron's packed (THD) batch against HF one sequence at a time. Seen (2026-12-01): 4.8e-7
# and 9.5e-7 on the two ranks, before and after the update; HF with two experts swapped: 0.068 and 0.073.
LOGPROB_TOL = 1e-4
# the negative control must be far outside the tolerance
CONTROL_MIN_GAP = 100 * LOGPROB_TOL
EXPERT_KEY = ".mlp.experts."


class CheckError(Exception):
    """A step failed; one line saying which and why."""


# --- the parent: trees, packages, checkpoint, config; two ranks ------------------------------------------------


def prepare(work: Path, tree: Path | None) -> tuple[Path, Path, Path]:
    """(the patched verl tree: `tree` if given, else built in work; the Megatron packages; the checkpoint)."""
    from ascend_rl import artifacts, overlay

    # verl 0.6.0, named: this check's stack is its (megatron-core 0.12.1, vLLM 0.13), not the default base's
    recipe = overlay.load_recipe("deepseek_r1", "0.6.0")
    try:
        artifacts.verl_sdist(
            recipe.version, recipe.sdist_sha256
        )  # fetched once here, so its failure says what
        packages = artifacts.megatron_packages(Path(sys.executable))
    except artifacts.DownloadError as exc:
        raise CheckError(f"cannot fetch what the check needs: {exc}") from None
    if tree is None:
        tree = overlay.materialise(
            overlay.with_overlay(recipe, "cpu"), work / "verl-cpu", log=lambda msg: None
        )
    from ascend_rl.tiny import deepseek_v3 as tiny_deepseek

    model_dir = work / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    tiny_deepseek.make_checkpoint(model_dir, seed=1)
    return tree, packages, model_dir


def compose_config(tree: Path, model_dir: Path, extra: list[str]) -> dict:
    from omegaconf import OmegaConf

    from ascend_rl import preflight

    overrides = [f"actor_rollout_ref.model.path={model_dir}", *CONFIG_OVERRIDES, *extra]
    try:
        cfg = preflight.compose(tree, "ppo_megatron_trainer", overrides)
    except preflight.PreflightError as exc:
        raise CheckError(str(exc)) from None
    return OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(work: Path, tree: Path, packages: Path, timeout: int, undo: str | None) -> list[dict]:
    port = free_port()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(tree), str(packages), str(REPO)]),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(WORLD),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
    )
    procs = []
    for rank in range(WORLD):
        log = open(work / f"rank{rank}.log", "w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llm_rl.deepseek_r1.check_megatron",
                    "--rank",
                    str(rank),
                    "--work",
                    str(work),
                ]
                + (["--undo", undo] if undo else []),
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    results = []
    for rank, proc in enumerate(procs):
        path = work / f"rank{rank}.json"
        if proc.returncode != 0 or not path.is_file():
            log = (work / f"rank{rank}.log").read_text()
            raised = [
                ln
                for ln in log.splitlines()
                if re.match(r"(\[rank\d+\]: )?[A-Za-z_.]*(Error|Exception)\b", ln)
            ]
            why = raised[-1] if raised else f"see {work}/rank{rank}.log"
            raise CheckError(f"rank {rank} failed (exit {proc.returncode}): {why}")
        results.append(json.loads(path.read_text()))
    return results


# --- one rank ----------------------------------------------------------------------------------------------------


def make_batch(tokenizer_vocab: int, rank: int):
    """The rank's half of a batch: left-padded prompts, right-padded responses, random tokens, random advantages."""
    import torch
    from verl import DataProto

    gen = torch.Generator().manual_seed(100 + rank)
    n, p, r = PER_RANK, PROMPT_LEN, RESPONSE_LEN
    prompts = torch.randint(3, tokenizer_vocab, (n, p), generator=gen)
    responses = torch.randint(3, tokenizer_vocab, (n, r), generator=gen)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    response_mask = torch.ones(n, r, dtype=torch.long)
    for i in range(n):  # prompts of different lengths (left padding), responses ending early (right padding)
        prompt_mask[i, : i * 2] = 0
        response_mask[i, r - i * 3 :] = 0
    prompts = prompts * prompt_mask
    responses = responses * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(n, r, generator=gen) * response_mask
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": responses,
            "response_mask": response_mask.float(),
            "advantages": advantages,
        },
        meta_info={"micro_batch_size": 2, "temperature": 1.0, "use_dynamic_bsz": False},
    )


def hf_log_probs(hf_model, batch):
    """HF's log-probs of each response token, sequence by sequence, only the real tokens fed (no padding)."""
    import torch

    out = torch.zeros(batch.batch["responses"].shape)
    r = RESPONSE_LEN
    with torch.no_grad():
        for i in range(len(batch)):
            mask = batch.batch["attention_mask"][i].bool()
            ids = batch.batch["input_ids"][i][mask][None]
            n_resp = int(mask[-r:].sum())
            logits = hf_model(ids).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            out[i, :n_resp] = lp[-n_resp:]
    return out


def gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def export(actor, hf_config, tf_config, rollout_cfg, reshard: str) -> dict:
    import torch
    from verl.models.mcore import get_mcore_weight_converter
    from verl.utils.megatron_utils import per_tensor_generator

    converter = get_mcore_weight_converter(hf_config, torch.float32)
    layer_name_mapping = {
        "qkv_layer_name": "self_attention.linear_qkv.",
        "gate_proj_layer_name": "linear_fc1.",
    }
    cfg = dict(rollout_cfg, expert_reshard=reshard)
    from omegaconf import OmegaConf

    return {
        name: t.detach().clone().float()
        for name, t in per_tensor_generator(
            actor.actor_module,
            hf_config,
            converter,
            tf_config,
            layer_name_mapping,
            rollout_config=OmegaConf.create(cfg),
        )
    }


def hf_model_with(hf_config, weights: dict):
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM(hf_config).float()
    model.load_state_dict(weights, strict=True)  # every HF tensor, none other
    return model.eval()


def undo_fix(name: str) -> None:
    """Take one of cpu-0005's megatron-core fixes back off (a negative control: the run must then fail)."""
    import importlib

    if name == "split-sizes":  # upstream maybe_move_tensor_to_cpu: CPU split sizes stay tensors
        from megatron.core.transformer.moe import moe_utils, token_dispatcher

        importlib.reload(moe_utils)
        token_dispatcher.maybe_move_tensor_to_cpu = moe_utils.maybe_move_tensor_to_cpu
    elif name == "core-attention":  # upstream local DotProductAttention under MLA
        from megatron.core.models.gpt import gpt_layer_specs
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        gpt_layer_specs.DotProductAttention = DotProductAttention
    else:
        raise SystemExit(f"unknown fix {name!r}")


def update_as_the_worker_does(cfg, hf_config, actor, module, optimizer, batch) -> dict:
    """ActorRolloutRefWorker.update_actor run on this actor: the worker's method, called with the parts its
    init_model makes (the actor, its modules, optimizer, LR scheduler, FLOPs counter) and the batch as the trainer
    sends it with the old-log-prob pass skipped: no old_log_probs, no temperature, no micro-batch size."""
    import types

    from verl.utils.explicit_offload import actor_params_resident
    from verl.utils.flops_counter import FlopsCounter
    from verl.utils.megatron.optimizer import get_megatron_optimizer_param_scheduler
    from verl.utils.megatron_utils import offload_megatron_model_to_cpu, offload_megatron_optimizer
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    meg = cfg.actor.megatron
    worker = types.SimpleNamespace(
        _is_actor=True,
        _is_offload_param=meg.param_offload,
        _is_offload_optimizer=meg.optimizer_offload,
        config=cfg,
        actor=actor,
        actor_module=module,
        actor_optimizer=optimizer,
        actor_optimizer_scheduler=get_megatron_optimizer_param_scheduler(optimizer, cfg.actor.optim),
        flops_counter=FlopsCounter(hf_config),
        world_size=WORLD,
    )
    before = {"resident_before_offload": actor_params_resident(module)}
    if meg.param_offload:  # as init_model leaves the actor
        offload_megatron_model_to_cpu(module)
    if meg.optimizer_offload:
        offload_megatron_optimizer(optimizer)
    before["resident_after_offload"] = actor_params_resident(module)
    sent = batch.select(batch_keys=list(batch.batch.keys()))
    sent.meta_info = {"global_token_num": batch.batch["attention_mask"].sum(-1).tolist()}
    assert "old_log_probs" not in sent.batch.keys()
    t0 = time.perf_counter()
    out = ActorRolloutRefWorker.update_actor(worker, sent)
    metrics = out.meta_info["metrics"]
    return {
        **before,
        "resident_after_update": actor_params_resident(module),
        "update_s": round(time.perf_counter() - t0, 2),
        "grad_norm": [float(x) for x in metrics["actor/grad_norm"]],
        "metrics": sorted(metrics),
    }


def rank_main(rank: int, work: Path, undo: str | None) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(1234)
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    from verl.models.mcore import hf_to_mcore_config
    from verl.models.mcore.config_converter import mapping_string_to_attn_backend
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.megatron.optimizer import get_megatron_optimizer, init_megatron_optim_config
    from verl.utils.megatron_utils import McoreModuleWrapperConfig, make_megatron_module
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    if undo:
        undo_fix(undo)
    cfg = OmegaConf.create(json.loads((work / "config.json").read_text()))
    meg = cfg.actor.megatron
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=meg.tensor_model_parallel_size,
        pipeline_model_parallel_size=meg.pipeline_model_parallel_size,
        expert_model_parallel_size=meg.expert_model_parallel_size,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(meg.seed)  # verl's set_random_seed
    dp = mpu.get_data_parallel_world_size()
    cfg.actor.ppo_mini_batch_size = cfg.actor.ppo_mini_batch_size * cfg.rollout.n // dp  # as the worker does

    hf_config = AutoConfig.from_pretrained(cfg.model.path)
    override_tf = mapping_string_to_attn_backend(OmegaConf.to_container(meg.override_transformer_config))
    tf_config = hf_to_mcore_config(hf_config, torch.float32, **override_tf)
    wrap = McoreModuleWrapperConfig(
        is_value_model=False,
        share_embeddings_and_output_weights=getattr(hf_config, "tie_word_embeddings", False),
        wrap_with_ddp=True,
        use_distributed_optimizer=meg.use_distributed_optimizer,
    )
    module = make_megatron_module(
        wrap, tf_config, hf_config, None, {}, OmegaConf.to_container(meg.override_ddp_config)
    )
    optimizer = get_megatron_optimizer(module, init_megatron_optim_config(cfg.actor.optim))
    actor = MegatronPPOActor(
        config=omega_conf_to_dataclass(cfg.actor),
        model_config=hf_config,
        hf_config=hf_config,
        tf_config=tf_config,
        actor_module=module,
        actor_optimizer=optimizer,
    )
    built = time.perf_counter()
    result = {"rank": rank, "ep_rank": mpu.get_expert_model_parallel_rank(), "dp_size": dp}
    batch = make_batch(hf_config.vocab_size, rank)
    mask = batch.batch["response_mask"]
    rollout_cfg = OmegaConf.to_container(cfg.rollout)

    # round A: as initialised
    full_a = export(actor, hf_config, tf_config, rollout_cfg, "allgather")
    lp_a, _ = actor.compute_log_prob(batch, calculate_entropy=False)
    hf_a = hf_model_with(hf_config, full_a)
    result["tensors"] = len(full_a)
    result["hf_state_dict_keys_equal"] = set(full_a) == set(hf_a.state_dict())
    result["gap_initial"] = gap(lp_a, hf_log_probs(hf_a, batch), mask)
    # negative control: HF with experts 0 and 5 of the MoE layer swapped (they live on different EP ranks)
    swapped = dict(full_a)
    moe = [k for k in full_a if ".mlp.experts.0." in k]
    for k in moe:
        k5 = k.replace(".experts.0.", ".experts.5.")
        swapped[k], swapped[k5] = full_a[k5], full_a[k]
    result["gap_experts_swapped"] = gap(lp_a, hf_log_probs(hf_model_with(hf_config, swapped), batch), mask)

    # one update without old_log_probs (recompute_old_log_prob=False), by the worker's own update_actor, between
    # the offloads the worker does (init_model offloads; rollout_mode would reshard from the resident parameters)
    result.update(update_as_the_worker_does(cfg, hf_config, actor, module, optimizer, batch))
    full_b = export(actor, hf_config, tf_config, rollout_cfg, "allgather")
    result["tensors_moved"] = sum(not torch.equal(full_a[k], full_b[k]) for k in full_a)
    result["max_weight_change"] = max(float((full_a[k] - full_b[k]).abs().max()) for k in full_a)
    lp_b, _ = actor.compute_log_prob(batch, calculate_entropy=False)
    result["gap_updated"] = gap(lp_b, hf_log_probs(hf_model_with(hf_config, full_b), batch), mask)
    result["gap_updated_vs_initial_weights"] = gap(lp_b, hf_log_probs(hf_a, batch), mask)

    # the AlltoAllV export (ds-0006): this rank's rollout experts only, bit for bit
    resharded = export(actor, hf_config, tf_config, rollout_cfg, "alltoallv")
    n_exp = hf_config.n_routed_experts
    keep = range(rank * n_exp // WORLD, (rank + 1) * n_exp // WORLD)
    want = {k for k in full_b if EXPERT_KEY not in k or int(k.split(EXPERT_KEY)[1].split(".")[0]) in keep}
    result["alltoallv_names_as_planned"] = set(resharded) == want
    result["alltoallv_tensors"] = len(resharded)
    result["alltoallv_expert_tensors"] = sum(EXPERT_KEY in k for k in resharded)
    result["alltoallv_bit_equal"] = all(
        torch.equal(resharded[k], full_b[k]) for k in resharded if k in full_b
    )

    import psutil

    result["build_s"] = round(built - start, 2)
    result["rank_s"] = round(time.perf_counter() - start, 2)
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    result["rss_gib_end"] = round(psutil.Process().memory_info().rss / 2**30, 3)
    (work / f"rank{rank}.json").write_text(json.dumps(result, indent=2))
    dist.barrier()
    dist.destroy_process_group()


# --- checks ------------------------------------------------------------------------------------------------------


def checks(ranks: list[dict]) -> dict[str, bool]:
    return {
        "every tensor named and shaped as HF's": all(r["hf_state_dict_keys_equal"] for r in ranks),
        "log-probs equal HF's": all(r["gap_initial"] <= LOGPROB_TOL for r in ranks),
        "swapped experts disagree": all(r["gap_experts_swapped"] >= CONTROL_MIN_GAP for r in ranks),
        "offload emptied the parameters, update_actor brought them back": all(
            r["resident_before_offload"] and not r["resident_after_offload"] and r["resident_after_update"]
            for r in ranks
        ),
        "the update moved the weights": all(r["tensors_moved"] > 0 for r in ranks),
        "updated log-probs equal HF's with the new export": all(
            r["gap_updated"] <= LOGPROB_TOL for r in ranks
        ),
        "updated log-probs differ from the initial weights'": all(
            r["gap_updated_vs_initial_weights"] > LOGPROB_TOL for r in ranks
        ),
        "alltoallv delivers the planned experts": all(r["alltoallv_names_as_planned"] for r in ranks),
        "alltoallv tensors equal the all-gather's": all(r["alltoallv_bit_equal"] for r in ranks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, required=True, help="folder for the tree, checkpoint, result.json"
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--tree", type=Path, help="a verl tree already patched with the DeepSeek series and the CPU overlay"
    )
    parser.add_argument(
        "--timeout", type=int, default=600, help="seconds for the two ranks (default %(default)s)"
    )
    parser.add_argument(
        "--undo",
        choices=("split-sizes", "core-attention"),
        help="negative control: run without this megatron-core fix of cpu-0005 (the run must fail)",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="an extra Hydra override of the actor config (repeatable)",
    )
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if args.rank is not None:
        rank_main(args.rank, work, args.undo)
        return 0
    try:
        import torch  # noqa: F401
        import vllm  # noqa: F401  (the e2e environment; its torch 2.9.1 and verl's run-time requirements)
    except ImportError:
        print(
            "check_deepseek_megatron.py: run it with the e2e environment's Python (.venv-e2e/bin/python; "
            "bash scripts/setup_e2e.sh builds it)",
            file=sys.stderr,
        )
        return 1
    start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    for stale in work.glob("rank*.json"):
        stale.unlink()
    try:
        tree, packages, model_dir = prepare(work, args.tree)
        (work / "config.json").write_text(json.dumps(compose_config(tree, model_dir, args.override)))
        setup_s = time.perf_counter() - start
        ranks = run_ranks(work, tree, packages, args.timeout, args.undo)
    except CheckError as exc:
        print(f"check_deepseek_megatron.py: {exc}", file=sys.stderr)
        (work / "result.json").write_text(json.dumps({"error": str(exc)}, indent=2))
        return 1
    result = {
        "checks": checks(ranks),
        "ranks": ranks,
        "setup_s": round(setup_s, 2),
        "wall_s": round(time.perf_counter() - start, 2),
        "peak_rss_gib_sum": round(sum(r["peak_rss_gib"] for r in ranks), 3),
        "megatron_packages": str(packages),
    }
    (work / "result.json").write_text(json.dumps(result, indent=2))
    for name, ok in result["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for r in ranks:
        print(
            f"  rank {r['rank']}: gap {r['gap_initial']:.2e} (swapped experts {r['gap_experts_swapped']:.3f}), "
            f"after update {r['gap_updated']:.2e}, {r['tensors_moved']}/{r['tensors']} tensors moved, "
            f"peak {r['peak_rss_gib']} GiB"
        )
    print(f"check_deepseek_megatron: wall {result['wall_s']} s (set-up {result['setup_s']} s)")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
