"""Settings verl asserts only once its workers are up, or never: nodes, layout, group, LoRA, token budget."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ascend_rl.preflight.report import Check, load_file


def check_nodes(cfg, nnodes: str) -> Check:
    """trainer.nnodes is the node count the launcher starts and waits for (NNODES): one number, not two."""
    value = OmegaConf.select(cfg, "trainer.nnodes")
    if str(value) != str(nnodes).strip():
        return Check(
            "nodes",
            "FAIL",
            f"trainer.nnodes={value} but NNODES={nnodes} (the Ray cluster the launcher plans and waits for); "
            f"set the node count once, as NNODES={value} before the command, and drop the trainer.nnodes override",
        )
    return Check("nodes", "ok", f"{nnodes} (NNODES = trainer.nnodes)")


# verl's advantage estimators that compare each sample with the other samples of its prompt's group (the
# actor_rollout_ref.rollout.n answers to one prompt): with fewer than two there is no group to compare with.
GROUP_ESTIMATORS = (
    "grpo",
    "grpo_passk",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
)


def check_group(cfg) -> Check:
    """A group-relative estimator (GRPO, RLOO, ...) gets at least two samples per prompt (rollout.n >= 2): with
    one, each sample is its own group of one and verl falls back to a baseline of 0 (the raw reward as the
    advantage: no comparison, not the estimator asked for); with none, nothing is generated. verl's validate_config
    accepts both."""
    estimator = str(OmegaConf.select(cfg, "algorithm.adv_estimator", default=None))
    n = OmegaConf.select(cfg, "actor_rollout_ref.rollout.n", default=None)
    if estimator not in GROUP_ESTIMATORS or n is None:
        return Check("group", "ok", f"algorithm.adv_estimator={estimator}, rollout.n={n}")
    try:
        count = int(n)
    except (TypeError, ValueError):
        return Check("group", "FAIL", f"actor_rollout_ref.rollout.n={n!r} is not a sample count")
    if count < 2:
        return Check(
            "group",
            "FAIL",
            f"actor_rollout_ref.rollout.n={count} with algorithm.adv_estimator={estimator}: a group-relative "
            f"estimator compares each of a prompt's n samples with the others, so n < 2 has no group to learn from "
            f"({'no sample is generated' if count < 1 else 'each sample is a group of one: verl takes its raw reward as the advantage'}); "
            "set actor_rollout_ref.rollout.n to 2 or more (the recipes use 8 and 16)",
        )
    return Check("group", "ok", f"{estimator} over groups of {count} samples per prompt")


def check_lora(cfg) -> Check:
    """LoRA with the vLLM rollout is fenced: verl 0.6.0's hijack calls vLLM 0.13 with removed arguments."""
    rank = OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0) or 0
    if int(rank) > 0 and OmegaConf.select(cfg, "actor_rollout_ref.rollout.name") == "vllm":
        return Check(
            "lora",
            "FAIL",
            f"actor_rollout_ref.model.lora_rank={rank} with the vLLM 0.13 rollout is not supported: verl 0.6.0's "
            "LoRA hijack (verl/utils/vllm/utils.py) calls LoRAModel.from_lora_tensors with arguments vLLM 0.13 "
            "removed (embeddings, target_embedding_padding, embedding_modules); train full weights (lora_rank=0)",
        )
    return Check("lora", "ok", f"lora_rank={rank}")


def _layout_problems(cfg, nnodes: int, per_node: int) -> list[str]:
    """What verl would assert about the parallel sizes on nnodes x per_node devices."""

    def get(key: str, default: int = 1) -> int:
        value = OmegaConf.select(cfg, key, default=default)
        return int(value) if value is not None else default

    world = nnodes * per_node
    problems = []
    tp, dp = (
        get("actor_rollout_ref.rollout.tensor_model_parallel_size"),
        get("actor_rollout_ref.rollout.data_parallel_size"),
    )
    ep = get("actor_rollout_ref.rollout.expert_parallel_size")
    if ep > 1 and ep != tp * dp:
        problems.append(f"rollout expert_parallel_size {ep} != tensor {tp} x data {dp}")
    if world % (tp * dp):
        problems.append(f"rollout tensor x data parallel {tp * dp} does not divide {world} devices")
    for role in ("actor", "ref"):
        base = f"actor_rollout_ref.{role}.megatron"
        if OmegaConf.select(cfg, base) is None:
            continue
        mtp, mpp = get(f"{base}.tensor_model_parallel_size"), get(f"{base}.pipeline_model_parallel_size")
        mep = get(f"{base}.expert_model_parallel_size")
        if world % (mtp * mpp):
            problems.append(f"{role} tensor {mtp} x pipeline {mpp} does not divide {world} devices")
        elif (world // (mtp * mpp) * mtp) % mep:
            problems.append(f"{role} expert parallel {mep} does not divide data x tensor parallel")
    return problems


def check_layout(cfg) -> Check:
    """The parallel sizes fit the cluster (what verl asserts only once the workers are up)."""

    def get(key: str) -> int:
        value = OmegaConf.select(cfg, key, default=1)
        return int(value) if value is not None else 1

    nnodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    if nnodes < 1 or per_node < 1:
        return Check(
            "layout", "FAIL", f"trainer.nnodes={nnodes} x n_gpus_per_node={per_node}: both must be >= 1"
        )
    problems = _layout_problems(cfg, nnodes, per_node)
    if problems:
        valid = [n for n in range(1, 257) if not _layout_problems(cfg, n, per_node)][:5]
        hint = (
            f"these sizes fit trainer.nnodes (NNODES) = {', '.join(map(str, valid))}, ... at {per_node} devices "
            "per node; change the node count or"
            if valid
            else "no node count fits these sizes;"
        )
        return Check(
            "layout", "FAIL", "; ".join(problems) + f"; {hint} fix the parallel sizes in the overrides"
        )
    world = nnodes * per_node
    tp = get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    dp = get("actor_rollout_ref.rollout.data_parallel_size")
    ep = get("actor_rollout_ref.rollout.expert_parallel_size")
    # verl builds world / (TP x DP) rollout groups, each one vLLM engine over TP x DP devices (the
    # config's data_parallel_size is vLLM's own DP inside an engine, used with expert parallelism).
    groups = world // (tp * dp)
    engine = f"TP{tp}" + (f" x DP{dp}" if dp > 1 else "") + (f" = EP{ep}" if ep > 1 else "")
    split = f" (verl's rollout data parallel {groups}: each engine generates 1/{groups} of the batch)"
    return Check(
        "layout",
        "ok",
        f"{world} device{'s' if world > 1 else ''}, rollout {groups} vLLM engine{'s' if groups > 1 else ''} "
        f"of {engine}{split if groups > 1 else ''}",
    )


# Patched trees (deepseek_r1's ds-0007) carry the rollout's token-budget rule as a pure module; it is loaded from the
# tree so a dry run refuses exactly what that tree's vLLMRollout would. Without it, verl 0.6.0's own check applies.
TOKEN_BUDGET_MODULE = Path("verl") / "utils" / "vllm" / "token_budget.py"


def check_rollout_budget(cfg, verl_dir: Path) -> Check:
    """The vLLM rollout's max_num_batched_tokens passes the check the tree's rollout makes at construction."""

    def get(key: str, default=None):
        value = OmegaConf.select(cfg, f"actor_rollout_ref.rollout.{key}", default=default)
        return default if value is None else value

    if get("name") != "vllm":
        return Check("budget", "skipped", f"rollout {get('name')}")
    tokens, seqs, chunked = (
        int(get("max_num_batched_tokens", 8192)),
        int(get("max_num_seqs", 1024)),
        bool(get("enable_chunked_prefill", True)),
    )
    model_len = int(get("prompt_length", 512)) + int(get("response_length", 512))
    if get("mode", "sync") == "sync":  # the async server ignores rollout.max_model_len
        model_len = int(get("max_model_len", model_len))
    rule = verl_dir / TOKEN_BUDGET_MODULE
    if rule.is_file():
        problem = load_file(rule, "verl_token_budget").token_budget_problem(tokens, model_len, chunked, seqs)
    elif get("mode", "sync") == "sync" and chunked and tokens < model_len:
        problem = (
            f"verl 0.6.0's vLLM rollout refuses max_num_batched_tokens ({tokens}) < max_model_len ({model_len}) "
            "with enable_chunked_prefill=True; raise max_num_batched_tokens"
        )
    else:
        problem = None
    if problem:
        return Check("budget", "FAIL", problem)
    return Check(
        "budget",
        "ok",
        f"max_num_batched_tokens {tokens}, max_model_len {model_len}, chunked prefill {chunked}",
    )
