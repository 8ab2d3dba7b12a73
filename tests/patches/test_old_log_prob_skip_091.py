"""verl 0.9.1: the old-log-prob skip (shared-0016/0017) in the engine workers' PPO loss, and its config checks.

verl 0.9.1 trains through engine workers whose every engine (FSDP, Megatron, MindSpeed) takes its PPO loss from
verl/workers/utils/losses.py:ppo_loss; this file, run as a script in a subprocess on the patched Qwen 0.9.1
tree (PYTHONPATH=tree), calls verl's own ppo_loss on an unpadded batch made with verl's own padding helpers. With
actor.recompute_old_log_prob=False and no old_log_probs in the batch it must give the loss and gradients of the
call that gets old_log_probs from the same forward (what the old-log-prob pass hands over on-policy) exactly; a
stale old_log_probs (another policy's) must not. The control is the series without shared-0017: the skipped
batch then has no old_log_probs for ppo_loss to read. The trainer's branch (one actor forward per step) needs a
training run (issue 45, item 3), not run here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from patched_tree import patched_copy, run_on_tree

BASE = "0.9.1"


def _series(without: str | None = None):
    from ascend_rl import manifest

    recipe = manifest.load_recipe("qwen2_5", BASE)
    return replace(
        recipe, series=tuple(p for p in recipe.series if not (without and p.name.startswith(without)))
    )


@pytest.fixture(scope="module")
def measured(tmp_path_factory, pristine_base) -> dict:
    tree = tmp_path_factory.mktemp("skip091") / "verl-tree"
    patched_copy(pristine_base(BASE), tree, _series())
    result = run_on_tree(__file__, tree)
    print("old-log-prob skip in ppo_loss (verl 0.9.1):", json.dumps(result, indent=1))
    return result


@pytest.mark.slow
def test_runs_the_patched_091_tree(measured):
    assert measured["verl_file"].startswith(measured["tree"]), measured["verl_file"]


@pytest.mark.slow
def test_skip_equals_the_loss_given_the_same_forward(measured):
    loss = measured["ppo_loss"]
    assert loss["skip"] == loss["given"] and loss["grad_max_diff"] == 0.0
    assert loss["grad_abs_sum"] > 0.0  # a loss that moves the policy
    # the comparison can fail: old_log_probs of another policy give another loss and other gradients
    assert loss["stale"] != loss["given"] and loss["stale_grad_max_diff"] > 0.0


@pytest.mark.slow
def test_validate_config_refusals(measured):
    ref = measured["validate_config"]
    assert ref["on_policy"] == ""
    assert "ppo_mini_batch_size (2) < data.train_batch_size (4)" in ref["off_policy"]
    assert "use_kl_in_reward" in ref["kl_in_reward"]
    assert "bypass_mode" in ref["bypass_mode"]
    assert "rollout_is" in ref["rollout_is"]
    assert "optimal_token_baseline" in ref["optimal_token_baseline"]


# a second tree and subprocess (~40 s on two busy cores): the control runs in make test-full
@pytest.mark.slow
@pytest.mark.full
def test_without_the_behaviour_patch_the_skipped_batch_fails(tmp_path, pristine_base):
    tree = patched_copy(pristine_base(BASE), tmp_path / "control", _series(without="shared-0017"))
    result = run_on_tree(__file__, tree)
    assert result["ppo_loss"]["skip_error"].startswith("KeyError"), result["ppo_loss"]


# --------------------------------------------------------------------------- subprocess side


def _ppo_loss() -> dict:
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.attention_utils import unpad_input
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    bs, prompt_len, response_len = 3, 4, 5
    prompt_mask = torch.ones(bs, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    response_mask = torch.ones(bs, response_len, dtype=torch.long)
    response_mask[1, 3:] = 0  # right padding
    response_mask[2, 4:] = 0
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    logits = torch.randn(bs, prompt_len + response_len, generator=torch.Generator().manual_seed(0))
    logits.requires_grad_(True)
    advantages = torch.randn(bs, response_len, generator=torch.Generator().manual_seed(1))

    def call(recompute: bool, old_from: torch.Tensor | None):
        config = ActorConfig(
            strategy="fsdp",
            ppo_mini_batch_size=bs,
            ppo_micro_batch_size_per_gpu=bs,
            rollout_n=1,
            recompute_old_log_prob=recompute,
        )
        # the model's per-token log-probs, unpadded as the engine returns them
        values, *_ = unpad_input(torch.nn.functional.logsigmoid(logits).unsqueeze(-1), attention_mask)
        log_probs = values.squeeze(-1)
        data = TensorDict(
            {
                "prompts": torch.zeros(bs, prompt_len, dtype=torch.long),
                "responses": torch.zeros(bs, response_len, dtype=torch.long),
                "attention_mask": attention_mask,
                "response_mask": response_mask,
                "advantages": advantages,
            },
            batch_size=[bs],
        )
        if (
            old_from is not None
        ):  # what the old-log-prob pass hands over: a forward sliced the same way, detached
            old, *_ = unpad_input(torch.nn.functional.logsigmoid(old_from).unsqueeze(-1), attention_mask)
            data["old_log_probs"] = no_padding_2_padding(old.squeeze(-1), data).detach()
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=bs)
        loss, _ = ppo_loss(config, {"log_probs": log_probs}, data)
        (grad,) = torch.autograd.grad(loss, logits)
        return loss.item(), grad

    given, grad_given = call(True, logits.detach())
    stale, grad_stale = call(
        True, logits.detach() + 0.5 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    )
    out = {
        "given": given,
        "stale": stale,
        "stale_grad_max_diff": (grad_stale - grad_given).abs().max().item(),
        "grad_abs_sum": grad_given.abs().sum().item(),
    }
    try:
        skip, grad_skip = call(False, None)
    except Exception as exc:  # the control tree: ppo_loss still reads old_log_probs
        out["skip_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out.update(skip=skip, grad_max_diff=(grad_skip - grad_given).abs().max().item(), skip_error="")
    return out


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
        "optimal_token_baseline": ["algorithm.adv_estimator=optimal_token_baseline"],
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
    parser = argparse.ArgumentParser(description="The old-log-prob skip in verl 0.9.1's ppo_loss (CPU).")
    parser.add_argument("--tree", type=Path, required=True, help="patched verl 0.9.1 tree containing verl/")
    args = parser.parse_args()

    import verl

    result = {"tree": str(args.tree), "verl_file": verl.__file__, "ppo_loss": _ppo_loss()}
    if (args.tree / "verl/workers/config/actor.py").read_text().count("recompute_old_log_prob") > 0:
        result["validate_config"] = _validate(args.tree)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
