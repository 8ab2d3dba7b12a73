"""DeepSeek-R1 recipe data and model files: deepscaler.json to verl parquet, config.json derivation."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ascend_rl.data.util import FORMAT_SYSTEM_PROMPT, MATH_INSTRUCTION, run_cli
from llm_rl.deepseek_r1 import derive_config as derive_deepseek_config
from llm_rl.deepseek_r1 import prepare_deepscaler

# --- deepscaler.json -------------------------------------------------------------------------------

RECORDS = [
    {"problem": f"What is {i}+{i}?", "answer": str(2 * i), "solution": f"{i}+{i}={2 * i}"} for i in range(18)
]
RECORDS += [
    {"problem": "Half of one?", "answer": "\\boxed{\\frac{1}{2}}", "solution": "..."},
    {"problem": "Seven?", "answer": 7, "solution": "..."},
    {"problem": "No answer here", "answer": "", "solution": "..."},
    {"problem": "  ", "answer": "3", "solution": "..."},
    {"problem": "Null answer", "answer": None, "solution": "..."},
]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def convert(tmp_path, out_name="out", **kwargs):
    src = write_json(tmp_path / "deepscaler.json", RECORDS)
    out = tmp_path / out_name
    return prepare_deepscaler.convert(src, out, log=lambda _: None, **kwargs), out


def test_deepscaler_rows_and_split(tmp_path):
    stats, out = convert(tmp_path, test_size=0.25)
    assert (stats.rows, stats.skipped_no_problem, stats.skipped_no_answer) == (23, 1, 2)
    assert (stats.train, stats.test) == (15, 5)

    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    indices = [r["extra_info"]["index"] for r in train + test]
    assert sorted(indices) == list(range(20))  # every usable row once, by its position in the JSON list
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    by_index = {r["extra_info"]["index"]: r for r in train + test}
    assert by_index[3]["reward_model"] == {"style": "rule", "ground_truth": "6"}
    assert by_index[18]["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert by_index[19]["reward_model"]["ground_truth"] == "7"
    assert by_index[3]["prompt"] == [
        {"role": "system", "content": FORMAT_SYSTEM_PROMPT},
        {"role": "user", "content": f"What is 3+3?\n\n{MATH_INSTRUCTION}"},
    ]
    assert {r["data_source"] for r in train} == {"agentica-org/DeepScaleR-Preview-Dataset"}


def test_deepscaler_split_is_reproducible_and_seeded(tmp_path):
    _, a = convert(tmp_path, "a", test_size=5)
    _, b = convert(tmp_path, "b", test_size=5)
    _, c = convert(tmp_path, "c", test_size=5, seed=7)

    def test_ids(d):
        return [r["extra_info"]["index"] for r in pq.read_table(d / "test.parquet").to_pylist()]

    assert test_ids(a) == test_ids(b) and len(test_ids(a)) == 5
    assert test_ids(a) != test_ids(c)


def test_deepscaler_without_system_prompt(tmp_path):
    src = write_json(tmp_path / "deepscaler.json", RECORDS)
    argv = [
        "--input",
        str(src),
        "--output-dir",
        str(tmp_path / "out"),
        "--no-system-prompt",
        "--instruction",
        "",
    ]
    assert run_cli(prepare_deepscaler.main, argv) == 0
    row = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[0]
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]
    assert "\\boxed" not in row["prompt"][0]["content"]


def test_deepscaler_output_loads_in_verl_rlhf_dataset(tmp_path, monkeypatch):
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tiny_tokenizer import load_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    _, out = convert(tmp_path, test_size=0.25)
    tokenizer = load_tokenizer(tmp_path / "tokenizer")
    config = OmegaConf.create(
        {
            "max_prompt_length": 1024,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path / "verl-cache"),
        }
    )
    dataset = RLHFDataset(str(out / "test.parquet"), tokenizer, config)
    assert len(dataset) == 5
    item = dataset[0]
    text = tokenizer.decode(item["input_ids"][item["attention_mask"].bool()].tolist())
    # The explicit system message renders once, in place of the template's default.
    assert text.startswith("<|im_start|>system\n" + FORMAT_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n")
    assert text.count("<|im_start|>system") == 1


@pytest.mark.parametrize(
    ("content", "argv_extra", "message"),
    [
        ('[{"problem": "a", "answer": "1"}, {"problem": "b", ', [], "is not valid JSON"),
        ('{"problem": "a"}', [], "not a list of problems"),
        ('[{"question": "a", "label": "1"}]', [], "no object with keys problem, answer"),
        (json.dumps(RECORDS), ["--test-size", "20"], "leaves no training rows"),
        (json.dumps(RECORDS), ["--test-size", "2.5"], "neither a fraction"),
        (None, [], "does not exist"),
    ],
)
def test_deepscaler_bad_input_is_one_line(tmp_path, capsys, content, argv_extra, message):
    src = tmp_path / "deepscaler.json"
    if content is not None:
        src.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    assert run_cli(prepare_deepscaler.main, ["--input", str(src), "--output-dir", str(out), *argv_extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err
    assert not out.exists()


# --- config.json ------------------------------------------------------------------------------------

# The fields of the released DeepSeek-V3 config.json (FP8 checkpoint with one MTP layer).
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "DeepSeek-V3"
    d.mkdir()
    write_json(d / "config.json", DEEPSEEK_V3_CONFIG)
    return d


def test_derived_config_drops_quantisation_and_mtp(model_dir, tmp_path, capsys):
    out = tmp_path / "bf16" / "config.json"
    assert run_cli(derive_deepseek_config.main, ["--input", str(model_dir), "--output", str(out)]) == 0
    derived = json.loads(out.read_text(encoding="utf-8"))
    expected = {k: v for k, v in DEEPSEEK_V3_CONFIG.items() if k != "quantization_config"}
    expected["num_nextn_predict_layers"] = 0
    assert derived == expected
    assert list(derived) == list(expected)  # key order kept
    printed = capsys.readouterr().out
    assert "- quantization_config:" in printed and "~ num_nextn_predict_layers: 1 -> 0" in printed
    assert "torch_dtype" not in printed  # already bfloat16, so not a change

    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config.from_dict(derived)
    assert cfg.num_hidden_layers == 61 and getattr(cfg, "quantization_config", None) is None


def test_reduced_layers_variant(model_dir, tmp_path, capsys):
    out = tmp_path / "random-init"
    out.mkdir()
    assert (
        run_cli(
            derive_deepseek_config.main,
            ["--input", str(model_dir / "config.json"), "--output", str(out), "--num-layers", "4"],
        )
        == 0
    )
    derived = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert derived["num_hidden_layers"] == 4 and derived["num_nextn_predict_layers"] == 0
    assert "~ num_hidden_layers: 61 -> 4" in capsys.readouterr().out


def test_rerun_on_derived_config_changes_nothing(model_dir, tmp_path, capsys):
    first = tmp_path / "a.json"
    derive_deepseek_config.derive_file(model_dir, first, log=lambda _: None)
    derive_deepseek_config.derive_file(first, tmp_path / "b.json")
    assert "no change" in capsys.readouterr().out
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_config_dry_run_writes_nothing(model_dir, tmp_path):
    out = tmp_path / "out.json"
    assert (
        run_cli(derive_deepseek_config.main, ["--input", str(model_dir), "--output", str(out), "--dry-run"])
        == 0
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("same_file", "is the input"),
        ("same_dir", "is the input"),
        ("wrong_model", "not one of deepseek_v3"),
        ("too_many_layers", "between 1 and 61"),
        ("missing", "does not exist"),
        ("not_json", "not valid JSON"),
    ],
)
def test_config_refusals_are_one_line(model_dir, tmp_path, capsys, case, message):
    original = (model_dir / "config.json").read_bytes()
    argv = ["--input", str(model_dir / "config.json"), "--output", str(tmp_path / "out.json")]
    if case == "same_file":
        argv[3] = str(model_dir / "config.json")
    elif case == "same_dir":
        argv[3] = str(model_dir) + "/"
    elif case == "wrong_model":
        write_json(model_dir / "config.json", {**DEEPSEEK_V3_CONFIG, "model_type": "qwen2"})
    elif case == "too_many_layers":
        argv += ["--num-layers", "62"]
    elif case == "missing":
        argv[1] = str(tmp_path / "nowhere" / "config.json")
    elif case == "not_json":
        (model_dir / "config.json").write_text('{"model_type": "deepseek_v3",', encoding="utf-8")
    assert run_cli(derive_deepseek_config.main, argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err
    assert not (tmp_path / "out.json").exists()
    if case in ("same_file", "same_dir"):
        assert (model_dir / "config.json").read_bytes() == original
