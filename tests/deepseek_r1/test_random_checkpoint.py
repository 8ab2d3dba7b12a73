"""random_checkpoint (the DeepSeek launcher's --variant random on verl 0.9.1): a random HF checkpoint of the model's
config, written once and reused, never half-written where a launch looks, with the config's tensors and shapes.

The config is the tiny DeepSeek-V3's (ascend_rl.tiny.deepseek_v3, transformers 4.57.6 here; the full-tier case runs
the same under transformers 5.5.4 in verl 0.9.1's e2e environment, where the routed experts are fused in memory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_rl.deepseek_r1 import random_checkpoint as rc

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # subprocesses that import torch and transformers


class _Tokenizer:  # what build_model reads of a tokenizer
    eos_token_id = 1
    pad_token_id = 2

    def __len__(self) -> int:
        return 1024


def reference(out: Path) -> Path:
    """The tiny DeepSeek-V3 as its maker builds it, saved by transformers: the shapes a random one must have."""
    from ascend_rl.tiny.deepseek_v3 import DeepSeekShape, build_model

    model = build_model(_Tokenizer(), DeepSeekShape(), seed=1)
    model.save_pretrained(out)
    (out / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return reference(tmp_path_factory.mktemp("tiny") / "model")


def tensors(folder: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118 (safe_open has no __iter__)
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "llm_rl.deepseek_r1.random_checkpoint", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_written_once_then_reused(tiny, tmp_path):
    lines: list[str] = []
    first = rc.write(tiny, tmp_path / "random", shard_bytes=1 << 20, log=lines.append)
    assert rc.is_complete(first) and first.parent == tmp_path / "random"
    assert any("writing 53 tensors" in ln for ln in lines), lines
    stamp = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert len([n for n in stamp if n.endswith(".safetensors")]) > 1  # sharded: 1 MiB shards
    lines.clear()
    again = rc.write(tiny, tmp_path / "random", shard_bytes=1 << 20, log=lines.append)
    assert again == first and lines == [f"random checkpoint: reusing {first}"]
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == stamp  # nothing rewritten
    assert [p.name for p in (tmp_path / "random").iterdir()] == [first.name]  # no temporary folder left
    # the files beside the weights come along; weights and stamp are readable as the umask says
    assert (first / "tokenizer_config.json").read_text() == (tiny / "tokenizer_config.json").read_text()
    assert json.loads((first / "config.json").read_text()) == json.loads((tiny / "config.json").read_text())
    mask = os.umask(0)
    os.umask(mask)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~mask for p in first.glob("*.safetensors"))
    # another seed or another config is another checkpoint
    assert rc.checkpoint_dir(tiny, tmp_path / "random", seed=2) != first
    changed = tmp_path / "changed"
    changed.mkdir()
    config = json.loads((tiny / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    assert rc.checkpoint_dir(changed, tmp_path / "random", seed=1) != first


def test_the_configs_tensors_and_shapes_are_what_transformers_loads(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = rc.write(tiny, tmp_path / "random", log=lambda _: None)
    ours, want = tensors(folder), tensors(tiny)
    assert {k: (tuple(v.shape), v.dtype) for k, v in ours.items()} == {
        k: (tuple(v.shape), v.dtype) for k, v in want.items()
    }
    assert not any(k.endswith("lm_head.weight") and "embed" in k for k in ours)
    # random, not the reference's weights; norms one, the rest drawn with initializer_range
    assert not all(ours[k].equal(want[k]) for k in ours if ours[k].dim() == 2)
    assert ours["model.norm.weight"].eq(1).all()
    bias = ours[
        "model.layers.1.mlp.gate.e_score_correction_bias"
    ]  # drawn: a sync that drops it changes routing
    assert bias.ne(0).all() and 0.03 < float(bias.std()) < 0.3, bias
    std = float(ours["model.layers.0.mlp.gate_proj.weight"].std())
    assert 0.015 < std < 0.025, std
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    # what the actor loads is what the reference loads: the file's tensors, both times
    again = AutoModelForCausalLM.from_pretrained(folder)
    for name, value in model.state_dict().items():
        assert value.equal(again.state_dict()[name]), name
        if name in ours:
            assert value.equal(ours[name]), name


def test_a_killed_writer_leaves_nothing_a_launch_uses_and_the_next_one_finishes(tiny, tmp_path):
    """kill -9 of the writer after its first shard: no checkpoint where a launch looks; the next writer removes the
    dead one's folder and writes the whole checkpoint."""
    out = tmp_path / "random"
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from llm_rl.deepseek_r1 import random_checkpoint as rc\n"
        "def log(line):\n"
        "    if 'shard 1 of' in line:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "rc.write(Path(sys.argv[1]), Path(sys.argv[2]), shard_bytes=1 << 20, log=log)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny), str(out)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]
    final = rc.checkpoint_dir(tiny, out, seed=1)
    assert not final.exists() and not rc.is_complete(final)
    (left,) = list(out.iterdir())
    assert left.name.startswith(f".{final.name}.tmp-") and list(left.glob("*.safetensors"))  # half-written
    dry = cli("--config", str(tiny), "--out", str(out), "--dry-run")
    assert dry.returncode == 0 and dry.stdout.strip() == str(final) and "not written yet" in dry.stderr
    done = cli("--config", str(tiny), "--out", str(out))
    assert done.returncode == 0 and done.stdout.strip() == str(final), done.stderr
    assert rc.is_complete(final) and [p.name for p in out.iterdir()] == [final.name]
    assert set(tensors(final)) == set(tensors(tiny))


def test_a_writer_that_loses_the_race_uses_the_winners_checkpoint(tiny, tmp_path):
    """Two writers at once: the second finishes while the first is still writing; the first's rename loses, it says
    so, removes its own folder and returns the winner's (whose files it leaves as they are)."""
    out = tmp_path / "random"
    final = rc.checkpoint_dir(tiny, out, seed=1)
    lines: list[str] = []
    other: dict = {}

    def log(line: str) -> None:
        lines.append(line)
        if "shard 1 of" in line and not other:
            other["proc"] = cli("--config", str(tiny), "--out", str(out), "--shard-gib", "0.001")
            other["files"] = {p.name: p.stat().st_mtime_ns for p in final.iterdir()}

    got = rc.write(tiny, out, shard_bytes=1 << 20, log=log)
    assert other["proc"].returncode == 0 and other["proc"].stdout.strip() == str(final), other["proc"].stderr
    assert got == final and f"random checkpoint: another writer finished {final} first; using it" in lines
    assert {p.name: p.stat().st_mtime_ns for p in final.iterdir()} == other["files"]
    assert [p.name for p in out.iterdir()] == [final.name]


@pytest.mark.parametrize(
    "content,says",
    [
        (None, "config.json does not exist"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "holds a JSON list, not a model config"),
        ('{"hidden_size": 8}', "has no model_type"),
        ('{"model_type": "deepseek_v3", "quantization_config": {}}', "derive_config"),
        ('{"model_type": "deepseek_v3", "torch_dtype": "int8"}', "asks for dtype 'int8'"),
        ('{"model_type": "no_such_model"}', "transformers cannot build a no_such_model model"),
    ],
)
def test_bad_input_ends_in_one_line_and_writes_nothing(tmp_path, content, says):
    model = tmp_path / "model"
    model.mkdir()
    if content is not None:
        (model / "config.json").write_text(content)
    proc = cli("--config", str(model), "--out", str(tmp_path / "random"))
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
    assert not (tmp_path / "random").exists() or not list((tmp_path / "random").iterdir())


def test_the_dry_run_names_the_folder_and_writes_nothing(tiny, tmp_path):
    proc = cli("--config", str(tiny), "--out", str(tmp_path / "random"), "--dry-run")
    assert proc.returncode == 0 and proc.stdout.strip() == str(
        rc.checkpoint_dir(tiny, tmp_path / "random", 1)
    )
    assert not (tmp_path / "random").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli("--config", str(empty), "--out", str(tmp_path / "random"), "--dry-run")
    assert proc.returncode == 0 and proc.stdout.strip() == str(empty) and "no config.json" in proc.stderr


TRANSFORMERS_5 = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ascend_rl.tiny.deepseek_v3 import DeepSeekShape, build_model
from llm_rl.deepseek_r1 import random_checkpoint as rc
from safetensors import safe_open
from transformers import AutoModelForCausalLM
import transformers
class Tok:
    eos_token_id, pad_token_id = 1, 2
    def __len__(self):
        return 1024
def tensors(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out
work = Path(sys.argv[2])
tiny = work / "model"
build_model(Tok(), DeepSeekShape(), seed=1).save_pretrained(tiny)  # the maker's model, saved by transformers 5
folder = rc.write(tiny, work / "random", log=lambda _: None)
ours, want = tensors(folder), tensors(tiny)
model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
print("RESULT " + json.dumps({
    "transformers": transformers.__version__,
    "same": {k: list(v.shape) for k, v in ours.items()} == {k: list(v.shape) for k, v in want.items()},
    "experts": sorted(k for k in ours if ".mlp.experts." in k)[:2],
    "n": len(ours),
    "info": {k: sorted(map(str, v)) for k, v in info.items()},
}))
"""


@pytest.mark.slow
@pytest.mark.full
def test_under_transformers_5_the_experts_are_written_one_by_one(e2e_python_091, tmp_path):
    """transformers 5 keeps DeepSeek-V3's routed experts fused in memory: the checkpoint has them as its save does,
    one by one (what Megatron-Bridge and vLLM load), and from_pretrained loads it with no key missing or unexpected."""
    proc = subprocess.run(
        [str(e2e_python_091), "-c", TRANSFORMERS_5, str(REPO), str(tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(line[len("RESULT ") :])
    assert got["transformers"].startswith("5.") and got["same"] and got["n"] == 53, got
    assert got["experts"] == [
        "model.layers.1.mlp.experts.0.down_proj.weight",
        "model.layers.1.mlp.experts.0.gate_proj.weight",
    ]
    assert not any(got["info"].values()), got
