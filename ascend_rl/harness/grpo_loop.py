"""The GRPO step of verl's RayPPOTrainer.fit, driven in-process on CPU through verl's own components."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ascend_rl.harness.adapters import ForwardCounter, InProcessActorGroup, in_process_hf_rollout
from ascend_rl.harness.verl_env import DemoError
from ascend_rl.paths import RECIPES

REWARD_FILE = RECIPES / "qwen2_5" / "new_math_reward.py"
# The dict-returning variant: verl's NaiveRewardManager stores each key per response in reward_extra_info.
REWARD_FN_NAME = "compute_score_dict"


@dataclass(frozen=True)
class DemoSettings:
    """What a demo run does; the defaults fit two CPU cores."""

    steps: int = 8
    seed: int = 1
    recompute_old_log_prob: bool = True
    prompts_per_step: int = 4
    # Eight samples per prompt: enough that a warm-started tiny policy, right now and then, gets mixed
    # rewards within a group, which is what gives GRPO a non-zero advantage.
    n: int = 8
    max_prompt_length: int = 192
    max_response_length: int = 64
    micro_batch: int = 8
    # The recipe's 1e-6 suits a pretrained 1.5B model; a 0.1M-parameter one needs a larger step to move.
    lr: float = 1e-4
    extra_overrides: tuple[str, ...] = ()


def hydra_overrides(s: DemoSettings, model_dir: Path, data: dict[str, Path]) -> list[str]:
    """The recipe's GRPO settings, scaled down, as overrides of verl's ppo_trainer.yaml."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"data.train_batch_size={s.prompts_per_step}",
        f"data.max_prompt_length={s.max_prompt_length}",
        f"data.max_response_length={s.max_response_length}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s.micro_batch}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        # torch.compile of the entropy kernel would spend the whole budget compiling on two cores.
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.recompute_old_log_prob={s.recompute_old_log_prob}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={s.n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={s.micro_batch}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={s.micro_batch}",
        f"custom_reward_function.path={REWARD_FILE}",
        f"custom_reward_function.name={REWARD_FN_NAME}",
        "reward_model.reward_manager=naive",
        "trainer.device=cpu",
        f"trainer.total_training_steps={s.steps}",
        *s.extra_overrides,
    ]


@dataclass
class Trainer:
    """verl's actor, reference, rollout, dataset and reward manager for one in-process run."""

    config: object
    tokenizer: object
    actor_module: object
    actor: object
    ref: object
    rollout: object
    reward_fn: object
    batches: Iterator
    counter: ForwardCounter
    initial_params: dict = field(default_factory=dict)


def build_trainer(config, seed: int) -> Trainer:
    """Load the tiny model and tokenizer from disk and wire verl's components the way its FSDP worker does."""
    import torch
    from omegaconf import open_dict
    from torch.utils.data import DataLoader, RandomSampler
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils import hf_tokenizer
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.rollout.hf_rollout import HFRollout

    arr = config.actor_rollout_ref
    tokenizer = hf_tokenizer(arr.model.path)
    dataset = RLHFDataset(data_files=config.data.train_files, tokenizer=tokenizer, config=config.data)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=config.data.train_batch_size,
        sampler=RandomSampler(dataset, generator=generator),
        collate_fn=collate_fn,
        drop_last=True,
    )

    torch.manual_seed(seed)
    actor_module = AutoModelForCausalLM.from_pretrained(arr.model.path, torch_dtype=torch.float32)
    ref_module = copy.deepcopy(actor_module).eval().requires_grad_(False)

    try:
        # validate_config's actor check; with patch shared-0100 it refuses an off-policy skip of old_log_prob.
        omega_conf_to_dataclass(arr.actor).validate(1, config.data.train_batch_size)
    except ValueError as exc:
        raise DemoError(str(exc)) from exc
    # The FSDP worker's normalisation: mini-batch counted in responses per rank, not prompts.
    with open_dict(arr):
        arr.actor.ppo_mini_batch_size *= arr.rollout.n
    actor_config = omega_conf_to_dataclass(arr.actor)
    optim = actor_config.optim
    optimizer = torch.optim.AdamW(
        actor_module.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
    )
    actor = DataParallelPPOActor(config=actor_config, actor_module=actor_module, actor_optimizer=optimizer)
    ref = DataParallelPPOActor(config=actor_config, actor_module=ref_module)
    rollout = in_process_hf_rollout(HFRollout)(actor_module, arr.rollout)
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    return Trainer(
        config=config,
        tokenizer=tokenizer,
        actor_module=actor_module,
        actor=actor,
        ref=ref,
        rollout=rollout,
        reward_fn=reward_fn,
        batches=_forever(loader),
        counter=ForwardCounter(actor_module),
        initial_params={k: v.detach().clone() for k, v in actor_module.state_dict().items()},
    )


def _forever(loader) -> Iterator:
    while True:
        yield from loader


def _mean(values) -> float:
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else float("nan")


def grpo_step(t: Trainer, step: int) -> dict:
    """One step of RayPPOTrainer.fit: rollout, reward, (old) log-probs, GRPO advantage, actor update."""
    import numpy as np
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
    from verl.trainer.ppo.reward import compute_reward

    if not hasattr(RayPPOTrainer, "_compute_old_log_prob"):
        raise DemoError(
            "verl's RayPPOTrainer lacks _compute_old_log_prob: apply patch shared-0101 (python3 -m ascend_rl overlay apply qwen2_5)"
        )
    cfg = t.config
    arr = cfg.actor_rollout_ref
    n = arr.rollout.n
    timing: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timing[f"timing/{name}"] = now - clock
        clock = now

    batch = DataProto.from_single_dict(next(t.batches))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    gen_batch.meta_info = {"eos_token_id": t.tokenizer.eos_token_id, "pad_token_id": t.tokenizer.pad_token_id}
    gen_batch = gen_batch.repeat(repeat_times=n, interleave=True)

    t.counter.enabled = False  # generation's per-token forwards are not the passes being compared
    gen_out = t.rollout.generate_sequences(gen_batch)
    t.counter.enabled = True
    t.counter.rows = 0
    lap("gen")

    batch = batch.repeat(repeat_times=n, interleave=True).union(gen_out)
    batch.batch["response_mask"] = compute_response_mask(batch)
    reward_tensor, reward_extra = compute_reward(batch, t.reward_fn)
    lap("reward")

    logp_meta = {
        "micro_batch_size": arr.rollout.log_prob_micro_batch_size_per_gpu,
        "temperature": arr.rollout.temperature,
        "use_dynamic_bsz": False,
    }
    metrics: dict[str, float] = {}
    timing_raw: dict[str, float] = {}
    # The patched trainer's own step (shared-0101): one actor pass, or none when recompute_old_log_prob=False.
    trainer_view = SimpleNamespace(config=cfg, actor_rollout_wg=InProcessActorGroup(t.actor, logp_meta))
    batch = RayPPOTrainer._compute_old_log_prob(trainer_view, batch, metrics, timing_raw)
    lap("old_log_prob")

    batch.meta_info.update(logp_meta)
    ref_log_prob, _ = t.ref.compute_log_prob(batch)
    batch.batch["ref_log_prob"] = ref_log_prob
    lap("ref")

    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = reward_tensor
    batch = compute_advantage(
        batch,
        adv_estimator=AdvantageEstimator.GRPO,
        num_repeat=n,
        norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
        config=cfg.algorithm,
    )
    lap("adv")

    batch.meta_info["temperature"] = arr.rollout.temperature
    actor_metrics = t.actor.update_policy(batch)
    lap("update_actor")

    responses = len(batch)
    scores = reward_tensor.sum(-1)
    pg_loss = sum(actor_metrics["actor/pg_loss"])
    kl_loss = sum(actor_metrics.get("actor/kl_loss", [0.0]))
    varied, groups = groups_with_varied_reward(scores.tolist(), batch.non_tensor_batch["uid"].tolist())
    # A response's advantage is one number spread over its tokens; the largest |value| per row is that number.
    response_adv = (batch.batch["advantages"] * batch.batch["response_mask"]).abs().amax(-1)
    row = {
        "step": step,
        "responses": responses,
        "groups": groups,
        "groups/reward_varied": varied,
        "advantage/nonzero_frac": float((response_adv > 0).float().mean()),
        "scored": len(reward_extra.get("score", [])),
        "reward/mean": float(scores.mean()),
        "reward/max": float(scores.max()),
        "reward/nonzero": int((scores != 0).sum()),
        "actor/loss": pg_loss + arr.actor.kl_loss_coef * kl_loss,
        "actor/pg_loss": pg_loss,
        "actor/kl_loss": kl_loss,
        "actor/grad_norm": _mean(actor_metrics["actor/grad_norm"]),
        "actor/ppo_kl": _mean(actor_metrics["actor/ppo_kl"]),
        "actor/forward_passes": t.counter.rows / responses,
        "response_length/mean": float(batch.batch["response_mask"].sum(-1).float().mean()),
        "advantage/abs_mean": float(batch.batch["advantages"].abs().mean()),
        **metrics,
        **timing,
    }
    for key, values in reward_extra.items():
        if key != "score" and values and all(isinstance(v, (int, float, bool)) for v in values):
            row[f"reward/{key}"] = _mean(values)
    row["weights/changed_from_init"] = weights_changed(t)
    return row


def groups_with_varied_reward(scores: list[float], uids: list[str]) -> tuple[int, int]:
    """(groups whose responses got different rewards, groups): only those give GRPO a non-zero advantage."""
    by_uid: dict[str, set[float]] = {}
    for score, uid in zip(scores, uids, strict=True):
        by_uid.setdefault(uid, set()).add(score)
    return sum(len(v) > 1 for v in by_uid.values()), len(by_uid)


def weights_changed(t: Trainer) -> float:
    """Largest absolute change of any actor weight since the run began."""
    return max(float((v - t.initial_params[k]).abs().max()) for k, v in t.actor_module.state_dict().items())


def evaluate(t: Trainer) -> dict:
    """Greedy answers to every test problem (data.val_files), scored by verl's reward manager with the reward file."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    from verl.trainer.ppo.reward import compute_reward
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    cfg = t.config
    dataset = RLHFDataset(data_files=cfg.data.val_files, tokenizer=t.tokenizer, config=cfg.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    gen_batch.meta_info = {
        "eos_token_id": t.tokenizer.eos_token_id,
        "pad_token_id": t.tokenizer.pad_token_id,
        "do_sample": False,
        "validate": True,
    }
    counting, t.counter.enabled = t.counter.enabled, False
    try:
        batch = batch.union(t.rollout.generate_sequences(gen_batch))
    finally:
        t.counter.enabled = counting
    batch.batch["response_mask"] = compute_response_mask(batch)
    reward_tensor, extra = compute_reward(batch, t.reward_fn)
    return {
        "problems": len(batch),
        "reward": float(reward_tensor.sum(-1).mean()),
        "correct": int(sum(bool(c) for c in extra.get("correct", []))),
    }


def run_steps(t: Trainer, steps: int, on_row: Callable[[dict], None]) -> list[dict]:
    """Run the steps, handing each metrics row to on_row as it is made."""
    rows = []
    for step in range(1, steps + 1):
        row = grpo_step(t, step)
        rows.append(row)
        on_row(row)
    return rows
