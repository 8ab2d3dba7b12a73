"""The tiny models and data are built once per machine (ascend_rl/harness/inputs.py): every output folder with the
same settings gets a copy, a killed build is redone, two builders at once build once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from ascend_rl.harness import inputs

REPO = Path(__file__).resolve().parents[2]


def _builder(calls: list):
    def build(model_dir: Path, data_dir: Path) -> None:
        calls.append(model_dir)
        model_dir.mkdir(parents=True)
        data_dir.mkdir(parents=True)
        (model_dir / "config.json").write_text("{}")
        (data_dir / "train.parquet").write_text("rows")

    return build


def test_a_second_output_folder_copies_what_the_first_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RECIPES_CACHE", str(tmp_path / "cache"))
    calls: list = []
    want = {"shape": {"hidden_size": 8}, "warm_start_steps": 3, "seed": 1}
    model, data = inputs.cached_inputs(tmp_path / "a", want, _builder(calls), "e2e")
    assert len(calls) == 1 and "inputs: built" in capsys.readouterr().out
    model2, data2 = inputs.cached_inputs(tmp_path / "b", want, _builder(calls), "e2e")
    assert len(calls) == 1, "the warm start ran again for the same settings"
    assert "reusing the machine's copy" in capsys.readouterr().out
    assert (model2 / "config.json").read_text() == "{}" and (data2 / "train.parquet").read_text() == "rows"
    assert json.loads((tmp_path / "b" / "inputs.json").read_text()) == want
    inputs.cached_inputs(tmp_path / "b", want, _builder(calls), "e2e")  # the folder's own copy, as before
    assert "reusing " + str(model2) in capsys.readouterr().out
    # other settings are another set
    inputs.cached_inputs(tmp_path / "c", {**want, "seed": 2}, _builder(calls), "e2e")
    assert len(calls) == 2


def test_the_key_follows_the_code_that_builds_the_inputs(monkeypatch):
    want = {"seed": 1}
    key = inputs.cache_key(want, "e2e")
    assert inputs.cache_key(want, "e2e") == key and inputs.cache_key(want, "demo") != key
    real = Path.read_bytes
    monkeypatch.setattr(
        Path, "read_bytes", lambda p: real(p) + b"# edited" if p.name == "warm_start.py" else real(p)
    )
    assert inputs.cache_key(want, "e2e") != key, "a change to the warm start must build a new set"


def test_a_build_killed_part_way_is_thrown_away_and_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPES_CACHE", str(tmp_path / "cache"))
    want = {"seed": 1}
    key = inputs.cache_key(want, "e2e")
    root = tmp_path / "cache" / "inputs"
    (root / f".{key}.4242" / "model").mkdir(parents=True)  # what a SIGKILLed builder leaves
    (root / key / "model").mkdir(parents=True)  # a set without its stamp is never complete
    calls: list = []
    folder, built = inputs.shared_inputs(want, _builder(calls), "e2e")
    assert built and len(calls) == 1 and (folder / "inputs.json").is_file()
    assert not list(root.glob(f".{key}.*"))


def test_two_builders_at_once_build_once(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from ascend_rl.harness import inputs

        def build(model_dir, data_dir):
            print("BUILD", flush=True)
            time.sleep(2)
            model_dir.mkdir(parents=True); data_dir.mkdir(parents=True)
            (model_dir / "config.json").write_text("{}"); (data_dir / "train.parquet").write_text("x")

        inputs.cached_inputs(Path(sys.argv[1]), {"seed": 7}, build, "e2e")
        """
    )
    env = {"RECIPES_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / f"out{i}")],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(o.count("BUILD") for o in outs) == 1, outs
    assert all((tmp_path / f"out{i}" / "model" / "config.json").is_file() for i in range(2))
