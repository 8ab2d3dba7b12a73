"""ascend_rl/data/tokenizer_config.py: install the recipe tokenizer config into a model folder, keep a backup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_rl.cli import tokenizer_config as itc_cli
from ascend_rl.data.util import FORMAT_SYSTEM_PROMPT, run_cli
from tiny_tokenizer import RECIPE_TOKENIZER_CONFIG, build_tokenizer_dir

ORIGINAL = b'{"tokenizer_class": "Qwen2Tokenizer", "chat_template": "original"}\n'


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "Qwen2_5_1_5B_Instruct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
    (d / "tokenizer_config.json").write_bytes(ORIGINAL)
    return d


def run(*argv) -> int:
    return run_cli(itc_cli.main, [str(a) for a in argv])


def test_install_backs_up_once_and_is_idempotent(model_dir, capsys):
    recipe = RECIPE_TOKENIZER_CONFIG.read_bytes()
    assert run(model_dir) == 0
    assert (model_dir / "tokenizer_config.json").read_bytes() == recipe
    assert (model_dir / "tokenizer_config.json.orig").read_bytes() == ORIGINAL

    assert run(model_dir) == 0
    assert "already installed" in capsys.readouterr().out.splitlines()[-1]

    # Someone edits the installed file; reinstalling must not turn that edit into the "original".
    (model_dir / "tokenizer_config.json").write_bytes(b"{}")
    assert run(model_dir) == 0
    assert (model_dir / "tokenizer_config.json.orig").read_bytes() == ORIGINAL
    assert (model_dir / "tokenizer_config.json").read_bytes() == recipe


def test_restore_returns_the_original(model_dir):
    assert run(model_dir) == 0
    assert run(model_dir, "--restore") == 0
    assert (model_dir / "tokenizer_config.json").read_bytes() == ORIGINAL
    assert not (model_dir / "tokenizer_config.json.orig").exists()


def test_chat_template_jinja_is_set_aside_so_ours_applies(model_dir):
    from transformers import AutoTokenizer

    build_tokenizer_dir(model_dir, RECIPE_TOKENIZER_CONFIG)  # adds tokenizer.json next to config.json
    (model_dir / "tokenizer_config.json").write_bytes(ORIGINAL)
    (model_dir / "chat_template.jinja").write_text("{{ 'downloaded template' }}", encoding="utf-8")
    assert run(model_dir) == 0
    assert not (model_dir / "chat_template.jinja").exists()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True
    )
    assert FORMAT_SYSTEM_PROMPT in text

    assert run(model_dir, "--restore") == 0
    assert (model_dir / "chat_template.jinja").read_text(encoding="utf-8") == "{{ 'downloaded template' }}"


def test_dry_run_changes_nothing(model_dir, capsys):
    assert run(model_dir, "--dry-run") == 0
    assert (model_dir / "tokenizer_config.json").read_bytes() == ORIGINAL
    assert not (model_dir / "tokenizer_config.json.orig").exists()
    assert "dry run: would back up" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no_config", "has no config.json"),
        ("not_qwen", "not qwen2"),
        ("restore_without_backup", "nothing to restore"),
    ],
)
def test_refusals_are_one_line(model_dir, capsys, case, message):
    argv = [model_dir]
    if case == "no_config":
        (model_dir / "config.json").unlink()
    elif case == "not_qwen":
        (model_dir / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}), encoding="utf-8")
    elif case == "restore_without_backup":
        argv.append("--restore")
    assert run(*argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err
    assert (model_dir / "tokenizer_config.json").read_bytes() == ORIGINAL


def test_force_installs_on_another_model_type(model_dir):
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    assert run(model_dir, "--force") == 0
    assert (model_dir / "tokenizer_config.json.orig").read_bytes() == ORIGINAL
