"""verl 0.7.1: the old-log-prob skip (shared-0102/0103) against the two-pass run, and bypass mode's deviation.

verl 0.7.1's own DataParallelPPOActor with a tiny random Qwen2 on CPU, in a subprocess on the deepseek_r1
0.7.1 tree (PYTHONPATH=tree). The skip (old_log_probs absent, log_prob.detach()) must give the two-pass run's
loss, gradients and weights exactly. Bypass mode (algorithm.rollout_correction.bypass_mode) takes
old_log_probs from the rollout instead; the rollout is stood in for by the same weights rounded to bfloat16
(as a bf16 rollout engine holds them), and its deviation is printed and asserted non-zero.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from patched_tree import free_port, patched_copy, ppo_batch, run_on_tree, tiny_qwen2

BATCH, PROMPT_LEN, RESPONSE_LEN, MICRO = 4, 6, 5, 2


@pytest.fixture(scope="module")
def measured(tmp_path_factory, pristine_base) -> dict:
    from ascend_rl import overlay

    tree = tmp_path_factory.mktemp("skip071") / "verl-tree"
    patched_copy(pristine_base("0.7.1"), tree, overlay.load_recipe("deepseek_r1", "0.7.1"))
    result = run_on_tree(__file__, tree)
    print("old-log-prob skip vs two-pass vs bypass (verl 0.7.1):", json.dumps(result, indent=1))
    return result


@pytest.mark.slow
def test_runs_the_patched_071_tree(measured):
    assert measured["verl_file"].startswith(measured["tree"]), measured["verl_file"]


@pytest.mark.slow
def test_skip_equals_two_pass_run(measured):
    upd = measured["update_policy"]
    assert upd["pg_loss_skip"] == upd["pg_loss_two_pass"]
    assert upd["grad_max_diff"] == 0.0
    assert upd["param_max_diff"] == 0.0
    assert upd["param_moved"] > 0.0  # not two runs that did nothing


@pytest.mark.slow
def test_bypass_mode_deviates(measured):
    byp = measured["bypass"]
    assert byp["old_vs_actor_max_diff"] > 0.0
    assert byp["loss_diff"] > 0.0 and byp["grad_max_diff"] > 0.0
    # bounded: bf16 rounding of a tiny model moves log-probs by well under one nat
    assert byp["old_vs_actor_max_diff"] < 1.0


@pytest.mark.slow
def test_off_policy_skip_refused(measured):
    msg = measured["off_policy_refusal"]
    assert "old_log_probs missing" in msg and "recompute_old_log_prob=True" in msg


@pytest.mark.slow
def test_validate_config_refusals(measured):
    ref = measured["validate_config"]
    assert ref["on_policy"] == ""
    assert "ppo_mini_batch_size" in ref["off_policy"]
    assert "use_kl_in_reward" in ref["kl_in_reward"]
    assert "bypass_mode" in ref["bypass_mode"]
    assert "rollout_is" in ref["rollout_is"]


# --------------------------------------------------------------------------- subprocess side


def _batch(old_log_probs=None):
    return ppo_batch(old_log_probs, BATCH, PROMPT_LEN, RESPONSE_LEN, MICRO)


def _actor(recompute: bool, mini: int = BATCH):
    import torch
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPActorConfig

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            self.seen = torch.cat([p.grad.detach().flatten() for g in self.param_groups for p in g["params"]])
            return super().step(closure)

    cfg = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=MICRO,
        use_torch_compile=False,
        grad_clip=1e9,
        recompute_old_log_prob=recompute,
        rollout_n=1,
    )
    model = tiny_qwen2(0)
    return DataParallelPPOActor(cfg, model, RecordingSGD(model.parameters(), lr=0.5))


def _flat(module):
    import torch

    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _update_policy_pair() -> dict:
    skip, two = _actor(False), _actor(True)
    start = _flat(two.actor_module).clone()
    m_skip = skip.update_policy(_batch())
    m_two = two.update_policy(_batch(old_log_probs=two.compute_log_prob(_batch())["log_probs"]))
    return {
        "pg_loss_skip": m_skip["actor/pg_loss"],
        "pg_loss_two_pass": m_two["actor/pg_loss"],
        "grad_max_diff": float((skip.actor_optimizer.seen - two.actor_optimizer.seen).abs().max()),
        "param_max_diff": float((_flat(skip.actor_module) - _flat(two.actor_module)).abs().max()),
        "param_moved": float((_flat(two.actor_module) - start).abs().max()),
    }


def _loss_and_grads(actor, data, old):
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor.actor_module.zero_grad()
    inputs = {**data.batch}
    log_prob = actor._forward_micro_batch(inputs, temperature=1.0)["log_probs"]
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=log_prob.detach() if old is None else old,
        log_prob=log_prob,
        advantages=inputs["advantages"],
        response_mask=inputs["response_mask"],
        loss_agg_mode="token-mean",
        config=actor.config,
    )
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in actor.actor_module.parameters()])
    return float(loss), grads


def _bypass() -> dict:
    """Bypass mode's old_log_probs (the rollout's: the weights rounded to bf16) against the skip's (log_prob.detach())."""
    import copy

    import torch

    actor = _actor(False)
    rollout = copy.deepcopy(actor)
    with (
        torch.no_grad()
    ):  # the rollout engine holds the weights in bf16: round them, compute as the actor does
        for param in rollout.actor_module.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    with torch.no_grad():
        rollout_lp = rollout.compute_log_prob(_batch())["log_probs"].float()
    actor_lp = actor.compute_log_prob(_batch())["log_probs"]
    mask = _batch().batch["response_mask"].bool()
    loss_skip, g_skip = _loss_and_grads(actor, _batch(), None)
    loss_byp, g_byp = _loss_and_grads(actor, _batch(), rollout_lp)
    return {
        "old_vs_actor_max_diff": float((rollout_lp - actor_lp)[mask].abs().max()),
        "loss_skip": loss_skip,
        "loss_bypass": loss_byp,
        "loss_diff": abs(loss_skip - loss_byp),
        "grad_max_diff": float((g_skip - g_byp).abs().max()),
        "grad_rel_diff": float((g_skip - g_byp).norm() / g_skip.norm()),
    }


def _off_policy_refusal() -> str:
    try:
        _actor(False, mini=MICRO).update_policy(_batch())
    except ValueError as exc:
        return str(exc)
    return ""


def _validate(tree: Path) -> dict:
    from hydra import compose, initialize_config_dir
    from verl.utils.config import validate_config

    base = [
        "actor_rollout_ref.actor.recompute_old_log_prob=False",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=1",
    ]
    cases = {
        "on_policy": [],
        "off_policy": ["actor_rollout_ref.actor.ppo_mini_batch_size=2"],
        "kl_in_reward": ["algorithm.use_kl_in_reward=True"],
        "bypass_mode": ["algorithm.rollout_correction.bypass_mode=True"],
        "rollout_is": ["algorithm.rollout_correction.rollout_is=token"],
    }
    out = {}
    with initialize_config_dir(config_dir=str(tree / "verl" / "trainer" / "config"), version_base=None):
        for name, extra in cases.items():
            config = compose(config_name="ppo_trainer", overrides=base + extra)
            try:
                validate_config(config, use_reference_policy=False, use_critic=False)
                out[name] = ""
            except ValueError as exc:
                out[name] = str(exc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Measure the old-log-prob skip and bypass mode on verl 0.7.1 (CPU)."
    )
    parser.add_argument("--tree", type=Path, required=True, help="patched verl 0.7.1 tree containing verl/")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import verl

    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        result = {
            "tree": str(args.tree),
            "verl_file": verl.__file__,
            "update_policy": _update_policy_pair(),
            "bypass": _bypass(),
            "off_policy_refusal": _off_policy_refusal(),
            "validate_config": _validate(args.tree),
        }
    finally:
        dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
