"""verl 0.6.0's own loader and reward managers drive the MATH reward (CPU, installed verl)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_reward import REWARD_PATH, make

from ci_policy import require

# required dev dependencies (requirements-dev.txt; verl 0.6.0 from scripts/setup_dev.sh): tests/ci_policy.py
torch = require("torch")
omegaconf = require("omegaconf")
verl_reward = require("verl.trainer.ppo.reward", "scripts/setup_dev.sh installs verl 0.6.0")
from verl import DataProto  # noqa: E402

ITEMS = [  # (response, ground truth, expected score)
    (make(), "1", 1.0),
    (make("\\boxed{\\dfrac{1}{4}}"), "0.25", 1.0),
    (make("\\boxed{(x+1)^2}"), "x^2+2x+1", 1.0),
    (make("\\boxed{7}"), "1", 0.0),
    (make(before="Sure! "), "1", 0.995),
    ("The answer is \\boxed{3}.", "3", 0.7),
]


@pytest.fixture(scope="module")
def tokenizer():
    """A real transformers fast tokenizer with one token per character, so decoding is lossless."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({c for response, _, _ in ITEMS for c in response} | set("prompt: "))
    vocab = {"[PAD]": 0, "[UNK]": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]")


def _data(tokenizer) -> DataProto:
    """A left-padded prompt / right-padded response batch shaped like verl's rollout output."""
    prompt_len = 8
    response_len = max(len(tokenizer.encode(r, add_special_tokens=False)) for r, _, _ in ITEMS) + 3
    prompts, responses, masks = [], [], []
    for response, _, _ in ITEMS:
        p = tokenizer.encode("prompt: ", add_special_tokens=False)
        r = tokenizer.encode(response, add_special_tokens=False)
        prompts.append([0] * (prompt_len - len(p)) + p)
        responses.append(r + [0] * (response_len - len(r)))
        masks.append(
            [0] * (prompt_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (response_len - len(r))
        )
    batch = {
        "prompts": torch.tensor(prompts),
        "responses": torch.tensor(responses),
        "attention_mask": torch.tensor(masks),
    }
    non_tensor = {
        "data_source": np.array(["DigitalLearningGmbH/MATH-lighteval"] * len(ITEMS), dtype=object),
        "reward_model": np.array([{"ground_truth": t, "style": "rule"} for _, t, _ in ITEMS], dtype=object),
    }
    return DataProto.from_dict(tensors=batch, non_tensors=non_tensor)


def _config(name: str, manager: str):
    return omegaconf.OmegaConf.create(
        {
            "custom_reward_function": {
                "path": str(REWARD_PATH),
                "name": name,
                "reward_kwargs": {"timeout": 2.0},
            },
            "reward_model": {"reward_manager": manager},
            "data": {"reward_fn_key": "data_source"},
        }
    )


@pytest.fixture
def fresh_custom_module():
    """verl caches the loaded file as sys.modules['custom_module']; each test loads it anew."""
    sys.modules.pop("custom_module", None)
    yield
    module = sys.modules.pop("custom_module", None)
    if module is not None:
        module.shutdown()


def _final_rewards(result: dict, data: DataProto) -> list[float]:
    tensor = result["reward_tensor"]
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1] :].sum(-1)
    assert tensor.sum().item() == pytest.approx(
        sum(tensor[i, lengths[i] - 1].item() for i in range(len(ITEMS)))
    )
    return [round(tensor[i, lengths[i] - 1].item(), 6) for i in range(len(ITEMS))]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "manager"),
    [("compute_score", "naive"), ("compute_score_dict", "naive"), ("compute_score_batch", "batch")],
)
def test_verl_reward_manager_scores_through_the_file(fresh_custom_module, tokenizer, name, manager):
    fn = verl_reward.get_custom_reward_fn(_config(name, manager))
    assert fn is not None
    reward_fn = verl_reward.load_reward_manager(_config(name, manager), tokenizer, num_examine=0)
    data = _data(tokenizer)
    result = reward_fn(data, return_dict=True)
    assert _final_rewards(result, data) == [round(s, 6) for _, _, s in ITEMS]
    extra = result["reward_extra_info"]
    if name == "compute_score":
        assert dict(extra) == {}
    else:
        assert extra["correct"] == [s > 0 for _, _, s in ITEMS]
        assert extra["format"][4] == pytest.approx(0.195) and extra["cot"][0] == 0.1
        assert {len(v) for v in extra.values()} == {len(ITEMS)}
