"""verl 0.9.1's MegatronEngine on a tiny DeepSeek-V3 on CPU: the driver of tests/harness/test_megatron_engine_091.py.

Run under `torch.distributed.run --nproc-per-node 2` (gloo, EP=2) in verl 0.9.1's e2e environment, with a verl tree
made by the overlay (`overlay apply <recipe> --base 0.9.1 --with cpu`: cpu-0014's platform, cpu-0016's Megatron
engine, cpu-0017's checkpoints) and the 0.9.1 Megatron packages (artifacts.megatron_packages(python, "0.9.1")) on
PYTHONPATH, and the CPU launch environment (the recipe's cpu_env). No monkeypatch here: what the CPU needs is the
overlay's; what the engine is given is configuration (OVERRIDES: what the recipe's CPU profile passes as
override_transformer_config; fp32, which cpu-0016 lets the engine config take on the CPU).

The engine is built as TrainingWorker builds it (EngineRegistry.new, then initialize()). Each rank writes what it
measured to <work>/result-r<rank>.json; the test asserts on the figures:
- log-probs of the response tokens from engine.infer_batch on a packed (THD) batch, as ray_trainer.py hands it to
  the worker, against transformers' DeepseekV3ForCausalLM one sequence at a time; the negative control: HF with
  the routed experts rolled by one;
- the bridge's export (engine.get_per_tensor_param) before the update against the checkpoint's tensors;
- one update (engine.train_batch, a toy loss) and how far it moves the log-probs; the export after it written as a
  safetensors checkpoint, loaded into HF (from_pretrained's loading info), and HF's log-probs against the engine's;
- a checkpoint round trip: save, a second update, load: the log-probs are the saved ones again;
- with --resume (a second run on the same --work): a fresh engine loads that checkpoint before any step, as a
  resumed run does (resume-r<rank>.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# What the bridges set and megatron-core without TransformerEngine / Apex / grouped_gemm cannot run, and the tiny
# model's plain RoPE (the bridge keeps MLA's YaRN defaults otherwise): the DeepSeek CPU profile's overrides.
OVERRIDES = {
    "moe_permute_fusion": False,
    "persist_layer_norm": False,
    "gradient_accumulation_fusion": False,
    "moe_grouped_gemm": False,
    "rope_type": "rope",
}


def make_batch(vocab: int, rank: int, n: int = 4, p: int = 12, r: int = 12):
    """Left-padded prompts, right-padded responses, random tokens."""
    import torch
    from verl import DataProto

    gen = torch.Generator().manual_seed(100 + rank)
    prompts = torch.randint(3, vocab, (n, p), generator=gen)
    responses = torch.randint(3, vocab, (n, r), generator=gen)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    response_mask = torch.ones(n, r, dtype=torch.long)
    for i in range(n):
        prompt_mask[i, : i * 2] = 0
        response_mask[i, r - i * 3 :] = 0
    prompts, responses = prompts * prompt_mask, responses * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    tensors = {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask.float(),
    }
    return DataProto.from_dict(tensors=tensors)


def to_engine_batch(batch, **extra):
    """The padded batch as ray_trainer.py hands it to the worker (no padding, nested), with infer_batch's keys."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        temperature=1.0,
        max_token_len_per_gpu=None,
        use_fused_kernels=False,
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
    )
    tu.assign_non_tensor(td, **extra)
    return td


def engine_log_probs(engine, batch):
    from verl.workers.utils.padding import no_padding_2_padding

    td = to_engine_batch(batch, compute_loss=False)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    return no_padding_2_padding(out["model_output"]["log_probs"], td)


def hf_log_probs(model, batch):
    """Each sequence alone, unpadded; the response tokens' log-probs, right-padded like verl's."""
    import torch

    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    out = torch.zeros(ids.shape[0], batch.batch["responses"].shape[1])
    with torch.no_grad():
        for i in range(ids.shape[0]):
            seq = ids[i][mask[i].bool()].unsqueeze(0)
            logits = model(seq).logits[0].float()
            lps = torch.log_softmax(logits[:-1], -1).gather(-1, seq[0, 1:].unsqueeze(-1)).squeeze(-1)
            n = int(batch.batch["response_mask"][i].sum())
            out[i, :n] = lps[len(lps) - n :]
    return out


def load_hf(path):
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    return model.eval(), {k: sorted(map(str, v)) for k, v in info.items()}


def build_engine(model: Path, ep: int):
    """As TrainingWorker.__init__ builds its engine (engine_workers.py: EngineRegistry.new)."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine import EngineRegistry

    engine_config = McoreEngineConfig(
        expert_model_parallel_size=ep,
        sequence_parallel=False,
        dtype="float32",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        infer_micro_batch_size_per_gpu=2,
        override_transformer_config=dict(OVERRIDES),
        seed=1,
    )
    return EngineRegistry.new(
        model_type="language_model",
        backend=engine_config.strategy,
        model_config=HFModelConfig(path=str(model), use_remove_padding=True),
        engine_config=engine_config,
        optimizer_config=McoreOptimizerConfig(lr=1e-2, total_training_steps=1, lr_warmup_steps_ratio=0.0),
        checkpoint_config=CheckpointConfig(),
    )


def toy_loss(model_output, data, dp_group=None):
    lp = model_output["log_probs"]
    loss = -(lp.values() if lp.is_nested else lp).float().mean()
    return loss, {"toy_loss": loss.detach().item()}


def export(engine) -> dict:
    gen, _ = engine.get_per_tensor_param()
    return {name: tensor.detach().float().cpu().clone() for name, tensor in gen}


def _gap(a, b, mask) -> float:
    return (a - b).abs()[mask].max().item()


def against_hf(engine, model: Path, batch) -> tuple[object, dict]:
    """The engine's log-probs of the batch, and their distance to HF's; the negative control: HF with every routed
    expert moved to the next one's place."""
    import torch

    mask = batch.batch["response_mask"].bool()
    lp = engine_log_probs(engine, batch)
    hf, _ = load_hf(model)
    gaps = {"logprob_gap": _gap(lp, hf_log_probs(hf, batch), mask)}
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if ".mlp.experts." in name and param.dim() == 3:
                param.copy_(param.roll(1, dims=0))
    gaps["control_gap_experts_rolled"] = _gap(lp, hf_log_probs(hf, batch), mask)
    return lp, gaps


def export_against_checkpoint(engine, model: Path) -> dict:
    """The bridge's export against the checkpoint's tensors: names, and the largest difference."""
    from safetensors.torch import load_file

    reference = load_file(str(model / "model.safetensors"))
    exported = export(engine)
    return {
        "count": len(exported),
        "routed_expert_tensors": sum(".mlp.experts." in k for k in exported),
        "missing": sorted(set(reference) - set(exported)),
        "extra": sorted(set(exported) - set(reference)),
        "max_diff_to_checkpoint": max(
            (exported[k] - reference[k].float()).abs().max().item() for k in reference if k in exported
        ),
        "unchanged_tensors": sum(
            (exported[k] == reference[k].float()).all().item() for k in reference if k in exported
        ),
        "router_bias_abs_sum": sum(
            reference[k].abs().sum().item() for k in reference if k.endswith("e_score_correction_bias")
        ),
    }


def one_update(engine, rank: int, world: int):
    """engine.train_batch on a batch of 4 sequences per rank with the toy loss; (its output, the batch)."""
    train = make_batch(engine.model_config.hf_config.vocab_size, rank)
    sizes = {"global_batch_size": 4 * world, "mini_batch_size": 4 * world}
    td = to_engine_batch(
        train, compute_loss=True, epochs=1, seed=1, dataloader_kwargs={"shuffle": False}, **sizes
    )
    with engine.train_mode():
        out = engine.train_batch(td, loss_function=toy_loss)
    return out, td


def export_into_hf(engine, model: Path, out_dir: Path, batch, lp) -> dict:
    """The export written as a checkpoint beside `model`'s config and tokenizer, loaded into HF: its loading info
    and HF's log-probs against the engine's `lp`. transformers 5 keeps the routed experts fused in memory: the
    export (per-expert names, as vLLM takes them) loads through from_pretrained's conversion."""

    from safetensors.torch import save_file

    exported = export(engine)
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(model, out_dir)
    save_file({k: v.contiguous() for k, v in exported.items()}, str(out_dir / "model.safetensors"))
    hf, info = load_hf(out_dir)
    return {
        "loading_info": info,
        "logprob_gap": _gap(lp, hf_log_probs(hf, batch), batch.batch["response_mask"].bool()),
    }


def checkpoint_round_trip(engine, ckpt: Path, train_td, batch, lp) -> dict:
    """save_checkpoint, a second update, load_checkpoint: how far the update moved the log-probs (`lp` the saved
    weights' ones), and how far they are from the saved ones after the load."""

    import torch.distributed as dist

    mask = batch.batch["response_mask"].bool()
    if dist.get_rank() == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.barrier()
    engine.save_checkpoint(str(ckpt), global_step=1)
    with engine.train_mode():
        engine.train_batch(train_td, loss_function=toy_loss)
    moved = _gap(engine_log_probs(engine, batch), lp, mask)
    engine.load_checkpoint(str(ckpt))
    return {"second_update_moved": moved, "after_load": _gap(engine_log_probs(engine, batch), lp, mask)}


def run(model: Path, work: Path) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"rank": rank, "world": world}
    t0 = time.time()
    engine = build_engine(model, ep=world)
    engine.initialize()
    tf = engine.tf_config
    result["engine"] = {
        "class": type(engine).__name__,
        "expert_model_parallel_size": tf.expert_model_parallel_size,
        "params_dtype": str(tf.params_dtype),
        "moe_grouped_gemm": tf.moe_grouped_gemm,
        "num_moe_experts": tf.num_moe_experts,
    }
    result["local_expert_params"] = sorted(
        name for name, _ in engine.module[0].named_parameters() if ".local_experts." in name
    )
    batch = make_batch(engine.model_config.hf_config.vocab_size, rank)
    lp, gaps = against_hf(engine, model, batch)
    result.update(gaps)
    result["export_before"] = export_against_checkpoint(engine, model)
    out, train_td = one_update(engine, rank, world)
    lp_after = engine_log_probs(engine, batch)
    result["update"] = {
        "grad_norm": out["metrics"].get("grad_norm"),
        "logprobs_moved": _gap(lp_after, lp, batch.batch["response_mask"].bool()),
    }
    result["export_after"] = export_against_checkpoint(engine, model)
    result["export_into_hf"] = export_into_hf(engine, model, work / f"exported-r{rank}", batch, lp_after)
    result["checkpoint"] = checkpoint_round_trip(engine, work / "ckpt", train_td, batch, lp_after)
    torch.save(lp_after, work / f"saved-logprobs-r{rank}.pt")  # what --resume compares with
    result["seconds"] = round(time.time() - t0, 1)
    result["modules"] = {
        "verl": sys.modules["verl"].__file__,
        "cpu_compat": sys.modules["verl.utils.megatron.cpu_compat"].__file__,
        "megatron.core": sys.modules["megatron.core"].__file__,
        "megatron.bridge": sys.modules["megatron.bridge"].__file__,
        "transformer_engine_loaded": "transformer_engine" in sys.modules,
    }
    return result


def resume(model: Path, work: Path) -> dict:
    """A fresh engine (a new process, as a resumed run's) loads run()'s checkpoint before any step (the optimizer
    holds no state yet: cpu-0017's zero states): its log-probs are the saved ones, and an update runs after it."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    engine = build_engine(model, ep=world)
    engine.initialize()
    batch = make_batch(engine.model_config.hf_config.vocab_size, rank)
    mask = batch.batch["response_mask"].bool()
    saved = torch.load(work / f"saved-logprobs-r{rank}.pt")
    fresh = _gap(engine_log_probs(engine, batch), saved, mask)
    engine.load_checkpoint(str(work / "ckpt"))
    loaded = _gap(engine_log_probs(engine, batch), saved, mask)
    out, _ = one_update(engine, rank, world)
    moved = _gap(engine_log_probs(engine, batch), saved, mask)
    return {
        "rank": rank,
        "before_load": fresh,
        "after_load": loaded,
        "update_after_load": {"grad_norm": out["metrics"].get("grad_norm"), "logprobs_moved": moved},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a tiny DeepSeek-V3 checkpoint")
    parser.add_argument(
        "--work", type=Path, required=True, help="where the export, checkpoint and results go"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="a fresh engine loads the checkpoint a run without it left in --work",
    )
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = (resume if args.resume else run)(args.model, args.work)
        name = "resume" if args.resume else "result"
        (args.work / f"{name}-r{dist.get_rank()}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"RESULT r{dist.get_rank()} " + json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
