"""CPU patch cpu-0007: the FSDP actor's forward passes compute in fsdp_config.mixed_precision.param_dtype.

verl 0.6.0 wraps DataParallelPPOActor._forward_micro_batch in torch.autocast(bfloat16) whatever the mixed
precision says; make demo sets it to fp32 because bf16 matmuls are slow on a CPU without bf16 units. The
patched tree (qwen2_5's series plus the CPU overlay) runs in a subprocess (PYTHONPATH=tree): a tiny random
Qwen2 in fp32, its log-probs through the actor against a plain fp32 forward of the same model. Unset, the
actor still computes in bf16 (what make e2e and every other launch get); fp32 matches the plain forward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from patched_tree import free_port, patched_copy, run_on_tree, tiny_qwen2

BATCH, PROMPT_LEN, RESPONSE_LEN = 2, 6, 5


@pytest.fixture(scope="module")
def measured(tmp_path_factory, _pristine_verl_master) -> dict:
    from ascend_rl import overlay

    tree = tmp_path_factory.mktemp("autocast") / "verl-tree"
    patched_copy(
        _pristine_verl_master, tree, overlay.with_overlay(overlay.load_recipe("qwen2_5", "0.6.0"), "cpu")
    )
    return run_on_tree(__file__, tree, timeout=600)


@pytest.mark.slow
def test_runs_the_patched_verl(measured):
    assert measured["verl_file"].startswith(measured["tree"]), measured["verl_file"]


@pytest.mark.slow
def test_unset_mixed_precision_still_computes_in_bf16(measured):
    unset = measured["unset"]
    assert unset["autocast_dtype"] == "torch.bfloat16"
    assert unset["max_diff_to_fp32"] > 1e-4  # bf16 rounding shows in the log-probs


@pytest.mark.slow
def test_fp32_mixed_precision_turns_autocast_off(measured):
    fp32 = measured["fp32"]
    assert fp32["autocast_dtype"] == "torch.float32"
    assert fp32["max_diff_to_fp32"] < 1e-5
    assert fp32["max_diff_to_fp32"] < measured["unset"]["max_diff_to_fp32"] / 100


# --------------------------------------------------------------------------- subprocess side


def _inputs() -> dict:
    import torch

    g = torch.Generator().manual_seed(1)
    seq = PROMPT_LEN + RESPONSE_LEN
    input_ids = torch.randint(1, 64, (BATCH, seq), generator=g)
    attention_mask = torch.ones(BATCH, seq, dtype=torch.long)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, PROMPT_LEN:],
    }


def _measure(mixed_precision: dict | None) -> dict:
    import torch
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

    model = tiny_qwen2(0)
    cfg = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=BATCH,
        ppo_micro_batch_size_per_gpu=BATCH,
        use_torch_compile=False,
        rollout_n=1,
        fsdp_config=FSDPEngineConfig(mixed_precision=mixed_precision),
    )
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0))
    inputs = _inputs()
    with torch.no_grad():
        _, log_prob = actor._forward_micro_batch(inputs, temperature=1.0)
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits.float()
    ref = torch.log_softmax(logits[:, PROMPT_LEN - 1 : -1], dim=-1)
    ref = ref.gather(-1, inputs["responses"].unsqueeze(-1)).squeeze(-1)
    return {
        "autocast_dtype": str(actor.autocast_dtype),
        "max_diff_to_fp32": float((log_prob.float() - ref).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Measure cpu-0007's autocast dtype on a patched verl tree (CPU)."
    )
    parser.add_argument("--tree", type=Path, required=True, help="patched tree containing verl/")
    args = parser.parse_args()

    import torch.distributed as dist
    import verl

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        result = {
            "tree": str(args.tree),
            "verl_file": verl.__file__,
            "unset": _measure(None),
            "fp32": _measure({"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}),
        }
    finally:
        dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
