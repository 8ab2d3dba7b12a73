"""The reward inside TRL: GRPOTrainer calls ``trl_reward`` and trains on its scores, one real step on CPU.

The tiny Qwen2 is built so that it answers every prompt with ``\\boxed{7}``: its layers add nothing to the
residual stream (attention and MLP output projections are zero), so each next token is a function of the
current one, and the embeddings and LM head spell that one string, then ``<|im_end|>``.  With truths 7 and 8
the reward must give 0.7 and 0, and TRL must log their mean.

The trainer tests run under the TRL requirements-dev.txt pins and, through
test_the_latest_trl_calls_the_reward_as_the_pinned_one_does, under TRL_LATEST: TRL 1.x calls reward functions
with more than the dataset's columns (trainer_state, log_extra, log_metric), and wants a newer datasets than
the pins allow, so it gets a venv of its own in the download cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_reward import load_reward

import ci_policy
from ci_policy import require
from tiny_tokenizer import build_tokenizer_dir

trl = require("trl", "requirements-dev.txt pins it")

REPO = Path(__file__).resolve().parents[2]
# PyPI's newest TRL on 2026-12-04 (`pip index versions trl`), and the oldest datasets it accepts (the pins'
# 4.0.0 is too old for it; a newer one would want a huggingface_hub the pinned transformers refuses)
TRL_LATEST, DATASETS_FOR_LATEST = "1.16.0", "4.7.0"
# set for the nested run under TRL_LATEST: the TRL that run must have imported
TRL_VERSION_ENV = "RECIPES_TRL_VERSION"
if os.environ.get(TRL_VERSION_ENV):
    assert trl.__version__ == os.environ[TRL_VERSION_ENV], (
        f"imported TRL {trl.__version__} from {trl.__file__}"
    )

ANSWER = "\\boxed{7}"
PROMPT = "What is 3 + 4? Answer:"


def _bigram_model(tokenizer, start_id: int):
    """A Qwen2ForCausalLM whose greedy and sampled continuation after start_id is ANSWER, then EOS."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    chain = [start_id, *tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.eos_token_id]
    assert len(set(chain[:-1])) == len(chain) - 1, "a bigram model needs distinct tokens"
    config = Qwen2Config(
        vocab_size=max(tokenizer.get_vocab().values()) + 1,  # the added tokens sit at Qwen2.5's real ids
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for k, (token, following) in enumerate(zip(chain, chain[1:], strict=False)):
            model.model.embed_tokens.weight[token, k] = 1.0
            model.lm_head.weight[following, k] = 50.0  # logit ~280 against 0 for every other token
    return model


def _trainer(tmp_path, shape: str, columns: dict, calls: list):
    """A GRPOTrainer on the bigram model whose dataset is two prompts of `shape` and `columns`; its reward
    function is trl_reward, each call (completions, kwargs, scores or the error) appended to calls."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    reward = load_reward()
    tokenizer = AutoTokenizer.from_pretrained(str(build_tokenizer_dir(tmp_path / "tokenizer")))
    if shape == "standard":
        prompts = [PROMPT, PROMPT]
        last = tokenizer.encode(PROMPT, add_special_tokens=False)[-1]
    else:
        prompts = [[{"role": "user", "content": PROMPT}]] * 2
        text = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
        last = tokenizer.encode(text, add_special_tokens=False)[-1]
    dataset = Dataset.from_dict({"prompt": prompts, **columns})

    def trl_reward(completions, **kwargs):  # what TRL hands over, and what the reward gives back
        call = {"completions": completions, "kwargs": kwargs}
        calls.append(call)
        try:
            call["scores"] = reward.trl_reward(completions, **kwargs)
        except ValueError as exc:
            call["error"] = str(exc)
            raise
        return call["scores"]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=16,
        max_steps=1,
        learning_rate=1e-4,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )
    return GRPOTrainer(
        model=_bigram_model(tokenizer, last),
        reward_funcs=trl_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize("shape", ["standard", "conversational"])
def test_grpo_trainer_trains_one_step_on_the_rewards_scores(tmp_path, shape):
    calls = []
    trainer = _trainer(tmp_path, shape, {"ground_truth": ["7", "8"], "level": ["1", "2"]}, calls)
    trainer.train()

    assert len(calls) == 1, "TRL did not call the reward once for its one step"
    call = calls[0]
    expected = ANSWER if shape == "standard" else [{"role": "assistant", "content": ANSWER}]
    assert call["completions"] == [expected] * 4
    truths = call["kwargs"]["ground_truth"]
    assert sorted(truths) == ["7", "7", "8", "8"] and call["kwargs"]["level"] == [
        {"7": "1", "8": "2"}[t] for t in truths
    ]
    assert call["scores"] == [0.7 if t == "7" else 0.0 for t in truths]
    # everything else TRL passes is one of its own arguments, which the missing-truth error leaves out
    theirs = set(call["kwargs"]) - {"ground_truth", "level"}
    assert theirs <= load_reward().TRL_NOT_COLUMNS, (
        f"TRL {trl.__version__} passes {sorted(theirs - load_reward().TRL_NOT_COLUMNS)} besides the dataset's "
        "columns; add them to TRL_NOT_COLUMNS in new_math_reward.py"
    )
    logged = next(entry for entry in trainer.state.log_history if "reward" in entry)
    assert logged["reward"] == pytest.approx(0.35) and logged["rewards/trl_reward/mean"] == pytest.approx(
        0.35
    )


def test_plain_and_conversational_completions_score_alike():
    reward = load_reward()
    text = "<think>\nStep 1: Solve it.\n</think>\n<answer>\nThe answer is $2\\sqrt{2}$.\n</answer>"
    plain = reward.trl_reward([text, text], ground_truth=["\\sqrt{8}", "3"])
    chat = reward.trl_reward(
        [
            [{"role": "assistant", "content": text}],
            [{"role": "assistant", "content": [{"type": "text", "text": text}]}],
        ],
        solution=["So it is $\\boxed{\\sqrt{8}}$.", "$\\boxed{3}$"],
    )
    assert plain == [0.9, 0.0] and chat == [0.9, 0.0]
    assert all(type(x) is float for x in plain + chat)


def test_a_dataset_without_a_truth_column_is_one_clear_error():
    """Called as TRL 1.x calls it: its own arguments (state, logging hooks) are never named as columns."""
    reward = load_reward()
    with pytest.raises(ValueError, match="ground_truth, solution, answer or reward_model") as err:
        reward.trl_reward(
            ["\\boxed{1}"],
            prompts=["p"],
            completion_ids=[[1]],
            question=["q"],
            trainer_state=object(),
            log_extra=lambda column, values: None,
            log_metric=lambda name, value: None,
        )
    assert str(err.value).endswith("the dataset's columns are ['question']")


@pytest.mark.parametrize("shape", ["standard", "conversational"])
def test_the_missing_truth_error_names_only_the_datasets_columns(tmp_path, shape):
    """GRPOTrainer itself calls the reward on a dataset with no truth column: one error, naming what the dataset
    has besides its prompt."""
    calls = []
    trainer = _trainer(tmp_path, shape, {"question": ["q1", "q2"], "level": ["1", "2"]}, calls)
    with pytest.raises(ValueError, match="the dataset's columns are"):
        trainer.train()
    assert len(calls) == 1 and "scores" not in calls[0]
    assert calls[0]["error"].endswith("the dataset's columns are ['level', 'question']"), calls[0]["error"]


# --- the newest TRL --------------------------------------------------------------------------------------


def _latest_trl_python() -> Path:
    """A Python that imports TRL_LATEST: a venv in the download cache, made once per machine under a lock, whose
    own site-packages come first and this environment's after them (a .pth line). It holds only what TRL_LATEST
    needs beyond this environment (TRL, datasets, datasets' httpx); torch and transformers are this one's. An
    unreachable index skips (fails under CI=true)."""
    import sysconfig

    from ascend_rl import artifacts

    here = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(f"{TRL_LATEST}\0{DATASETS_FOR_LATEST}\0{here}\0{sys.version}".encode()).hexdigest()
    root = artifacts.cache_dir() / f"venv-trl-{TRL_LATEST}-{key[:12]}"
    python = root / "bin" / "python"
    lock = os.open(artifacts.cache_dir() / f"{root.name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "ready").is_file():
            return python
        shutil.rmtree(root, ignore_errors=True)  # a build cut short has no ready marker
        subprocess.run(
            [sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=600
        )
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        (Path(site) / "recipes-tool-env.pth").write_text(f"{here}\n")
        wanted = [f"trl=={TRL_LATEST}", f"datasets=={DATASETS_FOR_LATEST}"]
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *wanted],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            error = artifacts.pip_failure(" ".join(wanted), f"{proc.stdout}\n{proc.stderr}")
            if isinstance(error, artifacts.IndexUnreachable):
                ci_policy.unreachable(f"TRL {TRL_LATEST}", error)
            pytest.fail(
                f"TRL {TRL_LATEST} cannot be installed beside this environment: {error}", pytrace=False
            )
        (root / "ready").write_text(" ".join(wanted) + "\n")
        return python
    finally:
        os.close(lock)


@pytest.mark.slow
def test_the_latest_trl_calls_the_reward_as_the_pinned_one_does(tmp_path):
    """This file's trainer tests again, under TRL_LATEST: its own GRPOTrainer builds the reward's arguments
    (trainer_state, log_extra and log_metric besides the columns), the scores train one step, the missing-truth
    error names the dataset's columns only."""
    python = _latest_trl_python()
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "nested"),
            str(Path(__file__).relative_to(REPO)),
            "-k",
            "grpo_trainer_trains or only_the_datasets_columns or without_a_truth_column",
        ],
        cwd=REPO,
        env={**os.environ, TRL_VERSION_ENV: TRL_LATEST},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert "5 passed" in proc.stdout, proc.stdout[-2000:]
