"""Evaluate a model on a test parquet the way the recipe's results table does: vLLM answers, new_math_reward.py scores.

MODEL is a Hugging Face folder (config.json, weights, a tokenizer with a chat template) or a verl
checkpoint folder (`.../global_step_N` or its `actor/`), which is first merged into a Hugging Face
folder by verl's own `python -m verl.model_merger merge --backend fsdp`. DATA is a parquet in the
recipe's format (prepare_math.py, prepare_math500.py): a `prompt` column of chat messages and
`reward_model.ground_truth`; `extra_info.level` / `extra_info.subject`, when present, give the
breakdown. Each prompt is rendered with the tokenizer's chat template as verl's RLHFDataset renders
it, answered by vLLM (vllm-ascend on an NPU host, the vLLM CPU build elsewhere), and every answer is
scored by the recipe's reward. Greedy by default (mean@1); `--n K --temperature T` samples K answers
per problem and reports mean@K and pass@k. Exit status: 0 done, 1 refused (one line says why), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ascend_rl.manifest import verl_tree
from ascend_rl.paths import REPO

RECIPE_DIR = REPO / "llm_rl" / "qwen2_5"
DEFAULT_REWARD = RECIPE_DIR / "new_math_reward.py"
COMPONENTS = ("score", "accuracy", "format", "cot")


class EvalError(Exception):
    """A predictable problem (missing model, wrong data, no chat template), reported as one line."""


@dataclass
class Problem:
    """One test row: its chat messages, the ground truth and what the breakdown groups it by."""

    index: int
    messages: list[dict]
    ground_truth: str
    level: str | None = None
    subject: str | None = None
    unique_id: str | None = None
    answers: list[dict] = field(default_factory=list)


# --- inputs ----------------------------------------------------------------------------------------


def default_verl_dir() -> Path:
    """The patched verl tree verl.model_merger is imported from: the CPU tree where it exists, else the recipe's."""
    for tree in (verl_tree("qwen2_5", "cpu"), verl_tree("qwen2_5")):
        if (tree / "verl" / "model_merger").is_dir():
            return tree
    return verl_tree("qwen2_5")


def checkpoint_actor(path: Path) -> Path | None:
    """The FSDP actor folder of a verl checkpoint at path (global_step_N or its actor/), or None."""
    for candidate in (path, path / "actor"):
        if (candidate / "fsdp_config.json").is_file() and (candidate / "huggingface").is_dir():
            return candidate
    return None


def merge_checkpoint(actor: Path, target: Path, verl_dir: Path, log=print) -> Path:
    """verl's own model merger (FSDP backend) writes actor's weights and tokenizer as a Hugging Face folder."""
    if (target / "config.json").is_file() and target.stat().st_mtime >= (
        actor / "fsdp_config.json"
    ).stat().st_mtime:
        log(f"evaluate: {target} already holds the merged checkpoint")
        return target
    if not (verl_dir / "verl" / "model_merger").is_dir():
        raise EvalError(
            f"{actor} is a verl checkpoint, and merging it needs verl's tree at {verl_dir} "
            "(python3 -m ascend_rl overlay fetch qwen2_5 && python3 -m ascend_rl overlay apply qwen2_5, or --verl-dir)"
        )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(verl_dir), os.environ.get("PYTHONPATH")) if p)
    )
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
    cmd += ["--local_dir", str(actor), "--target_dir", str(target)]
    log(f"evaluate: merging {actor} -> {target} (verl.model_merger)")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not (target / "config.json").is_file():
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise EvalError(f"verl.model_merger could not merge {actor}: {lines[-1] if lines else 'no output'}")
    return target


def resolve_model(path: Path, verl_dir: Path, merged_dir: Path | None, log=print) -> Path:
    """A Hugging Face folder for path: itself, or a verl checkpoint merged into merged_dir (default: beside it)."""
    if not path.exists():
        raise EvalError(
            f"model {path} does not exist; pass a Hugging Face folder or a verl global_step_N folder"
        )
    if (path / "config.json").is_file():
        return path
    actor = checkpoint_actor(path)
    if actor is None:
        raise EvalError(
            f"{path} is neither a Hugging Face folder (no config.json) nor a verl checkpoint "
            "(no fsdp_config.json and huggingface/ in it or in actor/)"
        )
    return merge_checkpoint(actor, merged_dir or actor.parent / "merged_hf", verl_dir, log)


def load_problems(path: Path, limit: int | None = None) -> list[Problem]:
    """The rows of a recipe-format parquet, or EvalError naming what is missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise EvalError(
            f"test data {path} does not exist; make it with ascend_rl/data/prepare_math.py or prepare_math500.py"
        )
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise EvalError(f"cannot read {path} as parquet ({str(exc).strip().splitlines()[0]})") from exc
    missing = [c for c in ("prompt", "reward_model") if c not in schema.names]
    if missing:
        raise EvalError(
            f"{path} lacks column(s) {', '.join(missing)} (has {', '.join(schema.names)}); "
            "evaluate.py reads the recipe's format, as ascend_rl/data/prepare_math.py writes it"
        )
    columns = ["prompt", "reward_model"] + (["extra_info"] if "extra_info" in schema.names else [])
    rows = pq.read_table(path, columns=columns).to_pylist()
    problems = []
    for i, row in enumerate(rows[:limit] if limit else rows):
        truth = (row.get("reward_model") or {}).get("ground_truth")
        messages = row.get("prompt")
        if truth is None or not messages:
            raise EvalError(
                f"{path} row {i} has no prompt or no reward_model.ground_truth; is it the recipe's format?"
            )
        extra = row.get("extra_info") or {}
        problems.append(
            Problem(
                index=int(extra.get("index", i)) if extra.get("index") is not None else i,
                messages=list(messages),
                ground_truth=str(truth),
                level=extra.get("level"),
                subject=extra.get("subject"),
                unique_id=extra.get("unique_id"),
            )
        )
    if not problems:
        raise EvalError(f"{path} has no rows")
    return problems


def load_tokenizer(model_dir: Path, chat_template: Path | None):
    """The model's tokenizer with a chat template (its own, or the one in --chat-template)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise EvalError(
            f"cannot load the tokenizer of {model_dir} ({str(exc).strip().splitlines()[0]})"
        ) from exc
    if chat_template is not None:
        text = chat_template.read_text(encoding="utf-8")
        tokenizer.chat_template = (
            json.loads(text)["chat_template"] if chat_template.suffix == ".json" else text
        )
    if not tokenizer.chat_template:
        raise EvalError(
            f"the tokenizer in {model_dir} has no chat template; install the recipe's "
            "(python3 -m ascend_rl tokenizer_config <model dir>) or pass "
            "--chat-template llm_rl/qwen2_5/tokenizer_config.json"
        )
    return tokenizer


def load_reward(path: Path):
    """The reward file as a module, loaded by path as verl's custom_reward_function loads it."""
    if not path.is_file():
        raise EvalError(f"reward file {path} does not exist")
    spec = importlib.util.spec_from_file_location("eval_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "compute_score_batch"):
        raise EvalError(
            f"{path} has no compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos)"
        )
    return module


# --- generation and scoring ------------------------------------------------------------------------


def render(problems: list[Problem], tokenizer) -> list[list[int]]:
    """Prompt token ids, rendered and tokenized exactly as verl's RLHFDataset does it."""
    ids = []
    for p in problems:
        text = tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def context_length(model_dir: Path, prompt_ids: list[list[int]], max_tokens: int) -> int:
    """The longest prompt plus --max-tokens, refused in one line when the model's positions do not reach it."""
    need = max(len(ids) for ids in prompt_ids) + max_tokens
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return need  # vLLM reads the config itself and says what is wrong with it
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and need > limit:
        longest = need - max_tokens
        raise EvalError(
            f"the longest prompt ({longest} tokens) plus --max-tokens {max_tokens} exceeds the model's "
            f"max_position_embeddings ({limit}); pass --max-tokens {max(limit - longest, 1)} or less"
        )
    return need


def build_engine(model_dir: Path, args: argparse.Namespace, max_model_len: int):
    """vLLM's offline engine on the model folder (eager, one device)."""
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=1,
        seed=args.seed,
    )


def warm_up(engine, prompt_ids: list[int]) -> None:
    """One short request, so the first batch's one-off start-up counts as load time, not as throughput."""
    from vllm import SamplingParams

    engine.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(max_tokens=2), use_tqdm=False)


def per_request_seed(seed: int) -> int | None:
    """The seed each request samples with; None on vLLM's CPU build, whose engine seed (LLM(seed=)) alone keeps
    the run repeatable. vLLM 0.13 rewinds a per-request generator's offset when it discards the sample of a
    partly prefilled request (gpu_model_runner), and CPU generators have no offset: `RuntimeError: CPU Generator
    does not use offset` once a batch is large enough for chunked prefill (seen: 64 problems x 8 answers)."""
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else seed


def generate(
    engine, prompt_ids: list[list[int]], args: argparse.Namespace
) -> list[list[tuple[str, int, bool]]]:
    """Per prompt, n answers as (text, token count, cut at max_tokens)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p if args.temperature > 0 else 1.0,
        max_tokens=args.max_tokens,
        seed=per_request_seed(args.seed),
    )
    outputs = engine.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
    return [[(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs] for out in outputs]


def score(problems: list[Problem], generated, reward, chunk: int = 256) -> None:
    """Score every answer with the reward's compute_score_batch; fills problem.answers."""
    from tqdm import tqdm

    flat = [
        (p, text, n_tok, cut)
        for p, outs in zip(problems, generated, strict=True)
        for text, n_tok, cut in outs
    ]
    with tqdm(total=len(flat), desc="Scoring answers", unit="answer") as bar:
        for start in range(0, len(flat), chunk):
            part = flat[start : start + chunk]
            results = reward.compute_score_batch(
                data_sources=["eval"] * len(part),
                solution_strs=[text for _, text, _, _ in part],
                ground_truths=[p.ground_truth for p, _, _, _ in part],
                extra_infos=None,
            )
            if len(results) != len(part):
                raise EvalError(f"the reward returned {len(results)} scores for {len(part)} answers")
            for (p, text, n_tok, cut), res in zip(part, results, strict=True):
                p.answers.append({"response": text, "response_tokens": n_tok, "truncated": cut, **res})
            bar.update(len(part))


# --- report ----------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with c correct among n samples (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarise(problems: list[Problem], n: int) -> dict:
    """Accuracy (mean@n, pass@k), the breakdowns, reward components and response lengths."""
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n} | {n})

    def group(ps: list[Problem]) -> dict:
        correct = [sum(bool(a["correct"]) for a in p.answers) for p in ps]
        out = {"problems": len(ps), f"mean@{n}": sum(c / n for c in correct) / len(ps)}
        if n > 1:
            out.update({f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(ps) for k in ks})
        return out

    answers = [a for p in problems for a in p.answers]
    lengths = [a["response_tokens"] for a in answers]
    report = {"overall": group(problems), "answers": len(answers), "samples_per_problem": n}
    for key in ("level", "subject"):
        buckets: dict[str, list[Problem]] = defaultdict(list)
        for p in problems:
            if getattr(p, key):
                buckets[str(getattr(p, key))].append(p)
        if buckets:
            report[f"by_{key}"] = {name: group(ps) for name, ps in sorted(buckets.items())}
    report["reward"] = {c: sum(float(a.get(c, 0.0)) for a in answers) / len(answers) for c in COMPONENTS}
    report["reward"]["timed_out"] = sum(bool(a.get("timed_out")) for a in answers) / len(answers)
    report["response_tokens"] = {
        "mean": statistics.fmean(lengths),
        "median": statistics.median(lengths),
        "max": max(lengths),
        "truncated": sum(a["truncated"] for a in answers) / len(answers),
    }
    return report


def table(report: dict, label: str) -> str:
    """The report as a terminal table."""
    n = report["samples_per_problem"]
    metric_keys = [k for k in report["overall"] if k != "problems"]
    lines = [f"{label}: {report['overall']['problems']} problems x {n} answer(s)"]
    header = f"  {'':<28} {'problems':>8} " + " ".join(f"{k:>8}" for k in metric_keys)
    lines.append(header)

    def row(name: str, g: dict) -> str:
        return f"  {name[:28]:<28} {g['problems']:>8} " + " ".join(f"{100 * g[k]:>8.2f}" for k in metric_keys)

    lines.append(row("all", report["overall"]))
    for key in ("by_level", "by_subject"):
        for name, g in report.get(key, {}).items():
            lines.append(row(name, g))
    r, t = report["reward"], report["response_tokens"]
    lines.append(
        f"  reward mean {r['score']:.3f} (accuracy {r['accuracy']:.3f}, format {r['format']:.3f}, "
        f"cot {r['cot']:.3f}; timed out {100 * r['timed_out']:.1f} %)"
    )
    lines.append(
        f"  response tokens mean {t['mean']:.1f}, median {t['median']:g}, max {t['max']}, "
        f"cut at --max-tokens {100 * t['truncated']:.1f} %"
    )
    return "\n".join(lines)


def write_answers(path: Path, problems: list[Problem]) -> None:
    """One JSON line per problem: its id, ground truth, level, subject and every scored answer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for p in problems:
            row = {
                "index": p.index,
                "unique_id": p.unique_id,
                "level": p.level,
                "subject": p.subject,
                "ground_truth": p.ground_truth,
                "prompt": p.messages[-1]["content"],
                "answers": p.answers,
            }
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


# --- command line ----------------------------------------------------------------------------------
