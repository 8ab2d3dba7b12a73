"""The Qwen2.5 recipe's tokenizer_config.json: Qwen2.5's special tokens and the answer-format chat template."""

from __future__ import annotations

import json

import pytest

from ascend_rl.data.util import FORMAT_SYSTEM_PROMPT
from tiny_tokenizer import RECIPE_TOKENIZER_CONFIG, load_tokenizer

# The answer format the reward scores, spelled out here independently of datautil.
EXPECTED_FORMAT_BLOCK = "<think>\nStep 1: ...\nStep 2: ...\n</think>\n<answer>\n\\boxed{...}\n</answer>"

QWEN25_ADDED_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(tmp_path_factory.mktemp("tiny-qwen-tokenizer"))


def render(tokenizer, messages, add_generation_prompt=True):
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def test_default_system_prompt_and_generation_prompt(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "What is 2+2?"}])
    assert text == (
        "<|im_start|>system\n"
        + FORMAT_SYSTEM_PROMPT
        + "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_system_prompt_asks_for_the_scored_format():
    assert FORMAT_SYSTEM_PROMPT.endswith("Use exactly this format:\n" + EXPECTED_FORMAT_BLOCK)
    assert "\\boxed{}" in FORMAT_SYSTEM_PROMPT
    # The reward wants each of these exactly once in a response; the example shows each exactly once.
    for tag in ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>"):
        assert EXPECTED_FORMAT_BLOCK.count(tag) == 1, tag


def test_explicit_system_message_replaces_the_default(tokenizer):
    text = render(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_without_generation_prompt_and_with_history(tokenizer):
    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nStep 1: add.\n</think>\n<answer>\n\\boxed{2}\n</answer>"},
        {"role": "user", "content": "And 2+2?"},
    ]
    text = render(tokenizer, messages, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\n" + FORMAT_SYSTEM_PROMPT + "<|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nStep 1: add.\n</think>\n<answer>\n\\boxed{2}\n</answer><|im_end|>\n"
        "<|im_start|>user\nAnd 2+2?<|im_end|>\n"
    )


def test_generation_prompt_leaves_think_to_the_response(tokenizer):
    # The reward counts "<think>\n" in the response; a pre-filled one would sit in the prompt instead.
    text = render(tokenizer, [{"role": "user", "content": "x"}])
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>assistant\n<think>" not in text


def test_special_tokens_encode_to_qwen_ids(tokenizer):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=True, add_generation_prompt=True
    )
    assert ids[0] == 151644
    assert ids.count(151645) == 2  # after the system and the user turn
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 151643
    assert tokenizer.bos_token is None


def test_added_tokens_are_qwen25s():
    config = json.loads(RECIPE_TOKENIZER_CONFIG.read_text(encoding="utf-8"))
    decoder = config["added_tokens_decoder"]
    assert [
        decoder[str(151643 + i)]["content"] for i in range(len(QWEN25_ADDED_TOKENS))
    ] == QWEN25_ADDED_TOKENS
    assert len(decoder) == len(QWEN25_ADDED_TOKENS)
    special = {entry["content"] for entry in decoder.values() if entry["special"]}
    assert special == set(QWEN25_ADDED_TOKENS[:14])
    assert config["additional_special_tokens"] == QWEN25_ADDED_TOKENS[1:14]
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["model_max_length"] == 131072
