"""The old-log-prob skip (actor.recompute_old_log_prob=False) is exact on-policy, and saves a forward pass.

The patched verl tree runs in a subprocess (PYTHONPATH=tree) so that it never mixes with the
unpatched verl installed in the venv: verl's own DataParallelPPOActor with a tiny random Qwen2
on CPU, in a one-process gloo group. The subprocess prints its measurements as JSON; the tests
here assert on them.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest

from patched_tree import free_port, patched_copy, ppo_batch, run_on_tree, tiny_qwen2

REPO = Path(__file__).resolve().parents[2]
BATCH, PROMPT_LEN, RESPONSE_LEN, MICRO = 4, 6, 5, 2


def _series(recipe: str) -> list[str]:
    with open(REPO / "llm_rl" / recipe / "recipe.toml", "rb") as fh:
        return tomllib.load(fh)["bases"]["0.6.0"]["series"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory, _pristine_verl_master) -> dict:
    """Run the checks below in a subprocess against the deepseek_r1-patched tree; return its JSON."""
    from ascend_rl import overlay

    assert any("old-log-prob-skip" in p for p in _series("deepseek_r1")), "skip patches not in the series"
    tree = tmp_path_factory.mktemp("skip") / "verl-tree"
    patched_copy(_pristine_verl_master, tree, overlay.load_recipe("deepseek_r1", "0.6.0"))
    return run_on_tree(__file__, tree)


@pytest.mark.slow
def test_runs_the_patched_verl(measured):
    assert measured["verl_file"].startswith(measured["tree"]), measured["verl_file"]


@pytest.mark.slow
def test_on_policy_detach_equals_recomputed_old_log_prob(measured):
    on = measured["on_policy"]
    assert on["old_vs_fresh_max_diff"] == 0.0
    assert on["loss_diff"] == 0.0
    assert on["grad_max_diff"] == 0.0
    assert on["grad_norm"] > 0.0  # the comparison is not between two zero gradients


@pytest.mark.slow
def test_skip_through_update_policy_matches_recompute(measured):
    upd = measured["update_policy"]
    assert upd["pg_loss_skip"] == upd["pg_loss_recompute"]
    assert upd["grad_max_diff"] == 0.0
    assert upd["param_max_diff"] == 0.0
    assert upd["param_moved"] > 0.0


@pytest.mark.slow
def test_stale_old_log_prob_differs_once_policy_moved(measured):
    off = measured["moved"]
    assert off["old_vs_fresh_max_diff"] > 1e-4
    assert off["loss_diff"] > 1e-6
    assert off["grad_max_diff"] > 1e-6


@pytest.mark.slow
def test_actor_refuses_skip_off_policy(measured):
    msg = measured["off_policy_refusal"]
    assert "old_log_probs missing" in msg and "off-policy" in msg and "recompute_old_log_prob=True" in msg


@pytest.mark.slow
def test_trainer_step_issues_one_actor_forward_pass_fewer(measured):
    rec, skip = measured["trainer_recompute"], measured["trainer_skip"]
    assert rec["compute_log_prob_calls"] == 1 and skip["compute_log_prob_calls"] == 0
    assert rec["update_actor_calls"] == skip["update_actor_calls"] == 1
    # one pass over the batch fewer: the log-prob pass's micro-batch forwards, no more, no less
    assert rec["model_forwards"] - skip["model_forwards"] == BATCH // MICRO
    assert "actor/entropy" in rec["metric_keys"] and "actor/entropy" not in skip["metric_keys"]
    assert skip["pg_loss"] == rec["pg_loss"]


# --------------------------------------------------------------------------- subprocess side


def _batch(old_log_probs=None):
    return ppo_batch(old_log_probs, BATCH, PROMPT_LEN, RESPONSE_LEN, MICRO)


def _recording_sgd(params, lr: float):
    """Plain SGD that keeps a copy of the gradients it stepped with (update_policy zeroes them after)."""
    import torch

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            self.seen_grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
            return super().step(closure)

    return RecordingSGD(params, lr=lr)


def _actor(seed: int = 0, recompute: bool = False, epochs: int = 1, mini: int = BATCH, lr: float = 0.5):
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPActorConfig

    cfg = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=MICRO,
        ppo_epochs=epochs,
        use_torch_compile=False,
        grad_clip=1e9,
        recompute_old_log_prob=recompute,
        rollout_n=1,
    )
    model = tiny_qwen2(seed)
    return DataParallelPPOActor(cfg, model, _recording_sgd(model.parameters(), lr=lr))


def _loss_and_grads(actor, data, old_log_prob):
    """The update_policy loss for one mini-batch, with old_log_prob either given or None (= log_prob.detach())."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor.actor_module.train()
    actor.actor_module.zero_grad()
    inputs = {**data.batch}
    _, log_prob = actor._forward_micro_batch(inputs, temperature=1.0)
    old = log_prob.detach() if old_log_prob is None else old_log_prob
    pg_loss, *_ = get_policy_loss_fn("vanilla")(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=inputs["advantages"],
        response_mask=inputs["response_mask"],
        loss_agg_mode="token-mean",
        config=actor.config,
    )
    pg_loss.backward()
    grads = torch.cat([p.grad.flatten() for p in actor.actor_module.parameters()])
    actor.actor_module.zero_grad()
    return pg_loss.detach(), grads


def _max_diff(a, b) -> float:
    return float((a - b).abs().max())


def _flat(tensors):
    import torch

    return torch.cat([t.flatten() for t in tensors])


def _on_policy_and_moved() -> tuple[dict, dict]:
    actor = _actor()
    data = _batch()
    old = actor.compute_log_prob(data)[0]
    _, fresh = actor._forward_micro_batch({**data.batch}, temperature=1.0)
    loss_a, grads_a = _loss_and_grads(actor, data, old)
    loss_b, grads_b = _loss_and_grads(actor, data, None)
    on = {
        "old_vs_fresh_max_diff": _max_diff(old, fresh.detach()),
        "loss_diff": abs(float(loss_a - loss_b)),
        "grad_max_diff": _max_diff(grads_a, grads_b),
        "grad_norm": float(grads_a.norm()),
    }
    actor.update_policy(data)  # the skip path: old_log_probs absent, one SGD step
    fresh_after = actor.compute_log_prob(data)[0]
    loss_a, grads_a = _loss_and_grads(actor, data, old)  # stale: the policy that produced the rollout
    loss_b, grads_b = _loss_and_grads(actor, data, None)
    moved = {
        "old_vs_fresh_max_diff": _max_diff(old, fresh_after),
        "loss_diff": abs(float(loss_a - loss_b)),
        "grad_max_diff": _max_diff(grads_a, grads_b),
    }
    return on, moved


def _update_policy_pair() -> dict:
    skip, rec = _actor(recompute=False), _actor(recompute=True)
    start = _flat([p.detach().clone() for p in rec.actor_module.parameters()])
    m_skip = skip.update_policy(_batch())
    m_rec = rec.update_policy(_batch(old_log_probs=rec.compute_log_prob(_batch())[0]))
    p_skip = _flat([p.detach() for p in skip.actor_module.parameters()])
    p_rec = _flat([p.detach() for p in rec.actor_module.parameters()])
    return {
        "pg_loss_skip": sum(m_skip["actor/pg_loss"]),
        "pg_loss_recompute": sum(m_rec["actor/pg_loss"]),
        "grad_max_diff": _max_diff(
            _flat(skip.actor_optimizer.seen_grads), _flat(rec.actor_optimizer.seen_grads)
        ),
        "param_max_diff": _max_diff(p_skip, p_rec),
        "param_moved": _max_diff(p_rec, start),
    }


def _off_policy_refusal() -> str:
    actor = _actor(mini=MICRO)  # two mini-batches: the second would see a moved policy
    try:
        actor.update_policy(_batch())
    except ValueError as exc:
        return str(exc)
    return ""


class _ActorWorkerGroup:
    """Test double for the Ray worker group only: delegates to a real DataParallelPPOActor, counts calls."""

    def __init__(self, actor):
        self.actor = actor
        self.calls = {"compute_log_prob": 0, "update_actor": 0}

    def compute_log_prob(self, data):
        from verl import DataProto

        self.calls["compute_log_prob"] += 1
        log_probs, entropys = self.actor.compute_log_prob(data, calculate_entropy=True)
        return DataProto.from_dict(tensors={"old_log_probs": log_probs, "entropys": entropys})

    def update_actor(self, data):
        from verl import DataProto

        self.calls["update_actor"] += 1
        return DataProto(meta_info={"metrics": self.actor.update_policy(data)})


def _trainer_step(recompute: bool, tree: Path) -> dict:
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    overrides = [f"actor_rollout_ref.actor.recompute_old_log_prob={recompute}"]
    with initialize_config_dir(config_dir=str(tree / "verl" / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    actor = _actor(recompute=recompute)
    forwards = [0]
    actor.actor_module.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only the step logic is exercised, no Ray cluster
    trainer.config = config
    trainer.actor_rollout_wg = wg = _ActorWorkerGroup(actor)
    metrics, timing_raw = {}, {}
    batch = trainer._compute_old_log_prob(_batch(), metrics, timing_raw)
    out = wg.update_actor(batch)
    return {
        "compute_log_prob_calls": wg.calls["compute_log_prob"],
        "update_actor_calls": wg.calls["update_actor"],
        "model_forwards": forwards[0],
        "metric_keys": sorted(metrics),
        "pg_loss": sum(out.meta_info["metrics"]["actor/pg_loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Measure the old-log-prob skip on a patched verl tree (CPU)."
    )
    parser.add_argument("--tree", type=Path, required=True, help="patched tree containing verl/")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import verl

    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        on, moved = _on_policy_and_moved()
        result = {
            "tree": str(args.tree),
            "verl_file": verl.__file__,
            "on_policy": on,
            "moved": moved,
            "update_policy": _update_policy_pair(),
            "off_policy_refusal": _off_policy_refusal(),
            "trainer_recompute": _trainer_step(True, args.tree),
            "trainer_skip": _trainer_step(False, args.tree),
        }
    finally:
        dist.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
