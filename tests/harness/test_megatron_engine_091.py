"""verl 0.9.1's Megatron engine on CPU (issue 46, step 2): MegatronEngine on a tiny DeepSeek-V3, megatron-core 0.16
and Megatron-Bridge 0.3.1, 2 gloo ranks at EP=2, on a verl tree the overlay makes, with no monkeypatch in the driver
(ascend_rl/harness/megatron_engine_091.py): what the CPU needs is the overlay's (cpu-0014, cpu-0016, cpu-0017).

The tree is the DeepSeek recipe's 0.9.1 series with the CPU overlay once that base exists, until then the Qwen
recipe's (the CPU overlay is per base, and the Megatron engine's files are verl's own in both). The run is in verl
0.9.1's e2e environment (e2e_python_091; transformers 5.5.4), with the 0.9.1 Megatron packages in their own folder
(artifacts.megatron_packages(python, "0.9.1")) on PYTHONPATH: full tier, as the environment is (test_e2e_091.py).

Also here, CI tier: the tiny DeepSeek-V3 maker's checkpoint under transformers 4.57.6 (the 0.6.0 / 0.7.1 runs'
environment) is byte for byte what it was before the maker learnt to draw the router bias under transformers 5.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import artifacts, manifest, overlay
from ci_policy import get_artifact

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "ascend_rl" / "harness" / "megatron_engine_091.py"
# model.safetensors of ascend_rl.tiny.deepseek_v3.make_checkpoint(seed=1) under the e2e environment (transformers
# 4.57.6, torch 2.9.1), made by the maker as it was at 060e1b9, before random_router_bias: the checkpoint every
# 0.6.0 / 0.7.1 DeepSeek CPU run has used (its router bias all zeros).
CHECKPOINT_4_57_6_SHA256 = "6373a7035b952fa8a206d071581208cbd0b9b90070bef77de5525abe43e4be5b"
# fp32 on both sides, packed THD against HF one sequence at a time: 4.8e-7 / 9.5e-7 seen
LOGPROB_TOL = 1e-5


def make_tiny_deepseek(python: Path, out: Path) -> dict:
    """make_checkpoint(out) under `python`; the checkpoint's sha256 and transformers' version."""
    code = (
        "import hashlib, json, sys, transformers\n"
        "from pathlib import Path\n"
        "from ascend_rl.tiny.deepseek_v3 import make_checkpoint\n"
        "out = make_checkpoint(Path(sys.argv[1]))\n"
        "digest = hashlib.sha256((out / 'model.safetensors').read_bytes()).hexdigest()\n"
        "print('MADE ' + json.dumps({'sha256': digest, 'transformers': transformers.__version__}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [str(python), "-c", code, str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MADE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("MADE ") :])


@pytest.mark.slow
@pytest.mark.ci
def test_the_tiny_deepseek_checkpoint_under_transformers_4_is_as_before(e2e_python, tmp_path):
    made = make_tiny_deepseek(e2e_python, tmp_path / "model")
    assert made["transformers"].startswith("4."), made
    assert made["sha256"] == CHECKPOINT_4_57_6_SHA256, "the 0.6.0 / 0.7.1 runs' tiny DeepSeek-V3 changed"


def recipe_on_091() -> str:
    """The recipe whose 0.9.1 series the tree carries: DeepSeek's once it has that base."""
    return "deepseek_r1" if "0.9.1" in overlay.load_recipe("deepseek_r1").bases else "qwen2_5"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare(python: Path, pristine_base, root: Path) -> tuple[Path, Path, Path, Path]:
    """(tree, model, packages, work): the overlay's CPU tree of verl 0.9.1 (recipe_on_091's series + the CPU
    overlay), the tiny DeepSeek-V3 checkpoint made under `python` (transformers 5), the 0.9.1 Megatron packages and
    an empty work folder, under `root`."""
    packages = get_artifact(
        "megatron-core / megatron-bridge (0.9.1)", artifacts.megatron_packages, python, "0.9.1"
    )
    recipe = recipe_on_091()
    tree = root / "verl-0.9.1-cpu"
    subprocess.run(["cp", "-a", str(pristine_base("0.9.1")), str(tree)], check=True)
    apply = [
        sys.executable,
        "-m",
        "ascend_rl",
        "overlay",
        "apply",
        recipe,
        "--base",
        "0.9.1",
        "--with",
        "cpu",
    ]
    proc = subprocess.run(
        [*apply, "--target", str(tree)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = root / "model"
    made = make_tiny_deepseek(python, model)
    assert made["transformers"].startswith("5."), made
    work = root / "work"
    work.mkdir()
    return tree, model, packages, work


def driver_env(tree: Path, packages: Path, *extra_path: str, **extra: str) -> dict[str, str]:
    """The driver's environment: the CPU platform's variables (cpu-0014: the recipe's 0.9.1 cpu_env, or Qwen's
    while DeepSeek's 0.9.1 base lists none), the tree and the Megatron packages (then `extra_path`) on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    cpu_env = manifest.resolve_launch(recipe_on_091(), "0.9.1", profile="cpu").cpu_env
    env.update(cpu_env or manifest.resolve_launch("qwen2_5", "0.9.1", profile="cpu").cpu_env)
    env.update(
        PYTHONPATH=os.pathsep.join([str(tree), str(packages), *extra_path]), OMP_NUM_THREADS="1", **extra
    )
    return env


def run_driver(python: Path, model: Path, work: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """The driver under torch.distributed.run, 2 processes on gloo."""
    run = [str(python), "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    run += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return subprocess.run(
        [*run, str(DRIVER), "--model", str(model), "--work", str(work), *extra],
        cwd=work.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.fixture(scope="module")
def engine_run(e2e_python_091, pristine_base, tmp_path_factory):
    """The driver under torch.distributed.run, 2 processes, then again with --resume; ({proc, results, resume_proc,
    resume}, the tree)."""
    tree, model, packages, work = prepare(
        e2e_python_091, pristine_base, tmp_path_factory.mktemp("megatron091")
    )
    env = driver_env(tree, packages)

    def driver(*extra: str) -> subprocess.CompletedProcess:
        return run_driver(e2e_python_091, model, work, env, *extra)

    def results(name: str) -> list:
        paths = (work / f"{name}-r0.json", work / f"{name}-r1.json")
        return [json.loads(path.read_text()) if path.is_file() else None for path in paths]

    proc = driver()
    resumed = driver("--resume") if proc.returncode == 0 else None
    return {
        "proc": proc,
        "results": results("result"),
        "resume_proc": resumed,
        "resume": results("resume"),
    }, tree


def _tail(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
@pytest.mark.full
def test_megatron_engine_091_on_the_tiny_deepseek_v3(engine_run):
    run, tree = engine_run
    proc, results = run["proc"], run["results"]
    assert proc.returncode == 0 and all(results), _tail(proc)
    for r in results:
        print(
            f"\nrank {r['rank']}: " + json.dumps({k: v for k, v in r.items() if k != "local_expert_params"})
        )
        # the overlay's tree and the 0.9.1 packages; TransformerEngine stubbed for the bridge's import only
        assert r["modules"]["verl"].startswith(str(tree)) and r["modules"]["cpu_compat"].startswith(str(tree))
        assert (
            "megatron-cp3" in r["modules"]["megatron.core"] and not r["modules"]["transformer_engine_loaded"]
        )
        engine = r["engine"]
        assert engine["class"] == "MegatronEngineWithLMHead" and engine["expert_model_parallel_size"] == 2
        assert engine["params_dtype"] == "torch.float32" and engine["moe_grouped_gemm"] is False
        # SequentialMLP: this rank's 4 of the 8 experts, fc1 and fc2 each
        assert len(r["local_expert_params"]) == 8, r["local_expert_params"]

        # log-probs equal HF's; the control (HF's routed experts rolled by one) is far off
        assert r["logprob_gap"] < LOGPROB_TOL, r["logprob_gap"]
        assert r["control_gap_experts_rolled"] > 1e3 * LOGPROB_TOL, r["control_gap_experts_rolled"]

        # the bridge's export before the update is the checkpoint, every tensor, the other rank's experts gathered
        before = r["export_before"]
        assert before["missing"] == [] and before["extra"] == [] and before["max_diff_to_checkpoint"] == 0.0
        assert before["count"] == before["unchanged_tensors"] == 53 and before["routed_expert_tensors"] == 24
        assert before["router_bias_abs_sum"] > 0, "the tiny model's router bias is zero under transformers 5"

        # one update moves the log-probs; its export loads strictly into HF and gives HF the engine's log-probs
        assert r["update"]["logprobs_moved"] > 1e3 * LOGPROB_TOL, r["update"]
        after = r["export_after"]
        assert after["count"] == 53 and after["missing"] == [] and after["unchanged_tensors"] == 0, after
        into_hf = r["export_into_hf"]
        assert all(not keys for keys in into_hf["loading_info"].values()), into_hf["loading_info"]
        assert into_hf["logprob_gap"] < LOGPROB_TOL, into_hf

        # checkpoint: a second update moves the log-probs, the load brings back the saved ones
        ckpt = r["checkpoint"]
        assert ckpt["second_update_moved"] > 1e3 * LOGPROB_TOL and ckpt["after_load"] < LOGPROB_TOL, ckpt


@pytest.mark.slow
@pytest.mark.full
def test_a_fresh_megatron_engine_091_resumes_from_that_checkpoint(engine_run):
    """A second process loads the checkpoint into an engine that has taken no step (torch AdamW without state:
    cpu-0017's zero states), as a resumed run does: the saved log-probs, then an update."""
    run, _ = engine_run
    proc, results = run["resume_proc"], run["resume"]
    assert proc is not None and proc.returncode == 0 and all(results), _tail(proc) if proc else "no first run"
    for r in results:
        print(f"\nresume rank {r['rank']}: " + json.dumps(r))
        assert r["before_load"] > 1e3 * LOGPROB_TOL, (
            r
        )  # the fresh engine is the initial model, not the saved one
        assert r["after_load"] < LOGPROB_TOL, r
        assert r["update_after_load"]["logprobs_moved"] > 1e3 * LOGPROB_TOL, r
