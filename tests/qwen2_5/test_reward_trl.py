"""The reward inside TRL: GRPOTrainer calls ``trl_reward`` and trains on its scores, one real step on CPU.

The tiny Qwen2 is built so that it answers every prompt with ``\\boxed{7}``: its layers add nothing to the
residual stream (attention and MLP output projections are zero), so each next token is a function of the
current one, and the embeddings and LM head spell that one string, then ``<|im_end|>``.  With truths 7 and 8
the reward must give 0.7 and 0, and TRL must log their mean.
"""

from __future__ import annotations

import pytest
from test_reward import load_reward

from ci_policy import require
from tiny_tokenizer import build_tokenizer_dir

trl = require("trl", "requirements-dev.txt pins it")

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


@pytest.mark.parametrize("shape", ["standard", "conversational"])
def test_grpo_trainer_trains_one_step_on_the_rewards_scores(tmp_path, shape):
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
    dataset = Dataset.from_dict({"prompt": prompts, "ground_truth": ["7", "8"], "level": ["1", "2"]})

    calls = []

    def trl_reward(completions, **kwargs):  # what TRL hands over, and what the reward gives back
        scores = reward.trl_reward(completions, **kwargs)
        calls.append({"completions": completions, "kwargs": kwargs, "scores": scores})
        return scores

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
    trainer = GRPOTrainer(
        model=_bigram_model(tokenizer, last),
        reward_funcs=trl_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
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
    reward = load_reward()
    with pytest.raises(ValueError, match="ground_truth, solution, answer or reward_model"):
        reward.trl_reward(["\\boxed{1}"], prompts=["p"], question=["q"])
