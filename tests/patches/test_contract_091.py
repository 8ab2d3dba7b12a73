"""The verl 0.9.1 base's stack against the real artifacts on the package index (issue 45, item 2).

constraints-0.9.1.txt pins by evidence; each pin is checked here against the requirement metadata it cites:
vllm-ascend 0.23.0.post1's PKG-INFO (its sdist, fetched by name: pip would build it to read it), vLLM 0.23.0's
wheel METADATA and verl 0.9.1's sdist PKG-INFO. Then the contracts of what the Qwen 0.9.1 series and its launch
touch in vllm, vllm-ascend and transformers: every vllm / transformers import of the patched 0.9.1 tree against
the vLLM 0.23.0 and transformers 5.5.4 wheels (ascend_rl/compat.py), and the engine shutdown shared-0014 calls.
The artifacts are read as archives, never installed or imported; each is downloaded once per machine (the cache of
ascend_rl/artifacts.py), and tests/ci_policy.py decides when one that cannot be had is a skip.
"""

from __future__ import annotations

import ast
import email
import re
import subprocess
import tarfile
import zipfile
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ascend_rl import artifacts, compat, manifest, overlay, stack
from ci_policy import get_artifact

BASE = "0.9.1"
CONSTRAINTS = stack.base_constraints("qwen2_5", BASE)


def pin(name: str) -> str:
    return artifacts.pinned(name, CONSTRAINTS)


@pytest.fixture(scope="module")
def vllm_091() -> Path:
    return get_artifact(f"vllm {pin('vllm')} wheel", artifacts.wheel, "vllm", pin("vllm"))


@pytest.fixture(scope="module")
def transformers_091() -> Path:
    version = pin("transformers")
    return get_artifact(f"transformers {version} wheel", artifacts.wheel, "transformers", version)


@pytest.fixture(scope="module")
def ascend_091() -> Path:
    version = pin("vllm-ascend")
    return get_artifact(f"vllm-ascend {version} sdist", artifacts.vllm_ascend_sdist, version)


@pytest.fixture(scope="module")
def verl_091(pristine_base) -> Path:
    return pristine_base(BASE)


@cache
def _member(archive: Path, suffix: str) -> str:
    """The text of the one member of a wheel or an sdist whose path ends with `suffix`."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            return zf.read(names[0]).decode() if len(names) == 1 else pytest.fail(f"{archive.name}: {names}")
    with tarfile.open(archive) as tar:
        names = [
            m
            for m in tar.getmembers()
            if m.name.endswith(suffix) and m.name.count("/") == suffix.count("/") + 1
        ]
        if len(names) != 1:
            pytest.fail(f"{archive.name} has {len(names)} members ending {suffix}")
        return tar.extractfile(names[0]).read().decode()


def requirements(metadata_text: str) -> dict[str, Requirement]:
    """name -> Requirement of every Requires-Dist without an extra marker."""
    found = {}
    for line in email.message_from_string(metadata_text).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or "extra" not in str(req.marker):
            found[re.sub(r"[-_.]+", "-", req.name).lower()] = req
    return found


@pytest.mark.slow
def test_the_091_pins_are_what_vllm_ascend_vllm_and_verl_require(ascend_091, vllm_091, verl_091):
    ascend = requirements(_member(ascend_091, "/PKG-INFO"))
    for name in ("torch", "torch-npu", "torchvision", "torchaudio", "triton-ascend", "transformers"):
        assert str(ascend[name].specifier) == f"=={pin(name)}", (
            f"vllm-ascend {pin('vllm-ascend')} wants {ascend[name]}"
        )
    assert "vllm" not in ascend  # vllm-ascend does not name vLLM: the pin is its versioning table's
    vllm = requirements(_member(vllm_091, ".dist-info/METADATA"))
    verl = requirements((verl_091 / "PKG-INFO").read_text())
    assert (
        pin("transformers") in vllm["transformers"].specifier
        and pin("transformers") in verl["transformers"].specifier
    )
    assert str(vllm["compressed-tensors"].specifier) == f"=={pin('compressed-tensors')}"
    assert pin("fastapi") in ascend["fastapi"].specifier and pin("fastapi") in vllm["fastapi"].specifier
    assert pin("ray") in verl["ray"].specifier and "ray" not in vllm and "ray" not in ascend
    # vLLM's wheel wants torch 2.11.0 (CUDA); the NPU stack builds vLLM for no device and keeps vllm-ascend's torch
    assert str(vllm["torch"].specifier) == "==2.11.0" != f"=={pin('torch')}"


# verl 0.9.1 was made against vLLM 0.24 (its `vllm` extra); on 0.23.0 these imports do not resolve. None is on
# the Qwen BF16 path: fp8 / nvfp4 / ModelOpt / QAT / ROCm MLA quantisation, the delta weight transfer, and two
# of the sdist's own test helpers (transformers 5 moved tokenization_utils).
KNOWN_UNRESOLVED_091 = {
    (
        "tests/special_e2e/envs/digit_completion/tokenizer.py",
        "from transformers.tokenization_utils import AddedToken",
    ),
    (
        "tests/special_e2e/envs/digit_completion/tokenizer.py",
        "from transformers.tokenization_utils import PreTrainedTokenizer",
    ),
    (
        "verl/utils/modelopt/vllm_modelopt_patch.py",
        "from vllm.model_executor.layers.fused_moe.fused_marlin_moe import MarlinExperts",
    ),
    (
        "verl/utils/qat/vllm_patch.py",
        "from vllm.model_executor.layers.quantization.utils.quant_utils import swizzle_blockscale",
    ),
    (
        "verl/utils/vllm/vllm_fp8_utils.py",
        "from vllm.model_executor.layers.quantization.utils.fp8_utils import maybe_post_process_fp8_weight_block",
    ),
    (
        "verl/utils/vllm/vllm_quant_utils.py",
        "from vllm.v1.attention.ops.rocm_aiter_mla_sparse import _get_cached_wo_a_bf16",
    ),
    (
        "verl/workers/rollout/vllm_rollout/delta_weight_transfer.py",
        "from vllm.model_executor.model_loader.checkpoint_weight_patch import CheckpointWeightPatch",
    ),
}


@pytest.mark.slow
def test_the_patched_091_tree_imports_resolve_on_vllm_0_23_but_the_known_few(
    base_tree, vllm_091, transformers_091
):
    tree = base_tree(BASE)
    overlay.apply_series(manifest.load_recipe("qwen2_5", BASE), tree, log=lambda m: None)
    report = compat.scan_tree(tree, [vllm_091, transformers_091])
    assert {(f.path, f.what) for f in report.unresolved} == KNOWN_UNRESOLVED_091, "\n".join(
        map(str, report.unresolved)
    )
    series_files = {
        fp.path
        for p in manifest.load_recipe("qwen2_5", BASE).series
        for fp in overlay.patchset.parse(p).files
    }
    assert not series_files & {path for path, _ in KNOWN_UNRESOLVED_091}
    assert report.checked > 200


def _class(source: str, name: str) -> ast.ClassDef:
    found = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
    return found[0] if found else pytest.fail(f"no class {name}")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next(
        (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
        None,
    )


@pytest.mark.slow
def test_the_engine_shutdown_shared_0014_calls_exists_on_vllm_and_vllm_ascend_0_23(
    vllm_091, ascend_091, verl_091
):
    # vLLMHttpServer.engine is AsyncLLM.from_vllm_config(...) in verl 0.9.1; shared-0014 calls its shutdown()
    server = (verl_091 / "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text()
    assert "engine_client = AsyncLLM.from_vllm_config(" in server and "self.engine = engine_client" in server
    shutdown = _method(_class(_member(vllm_091, "vllm/v1/engine/async_llm.py"), "AsyncLLM"), "shutdown")
    assert isinstance(shutdown, ast.FunctionDef), (
        "AsyncLLM.shutdown is no longer a plain method: shared-0014 calls it"
    )
    assert (
        len(shutdown.args.args) - len(shutdown.args.defaults) == 1
    )  # self only: shutdown() needs no argument
    executor = _member(vllm_091, "vllm/v1/executor/multiproc_executor.py")
    assert _method(_class(executor, "MultiprocExecutor"), "shutdown") is not None
    # on an NPU the executor is vllm-ascend's, which keeps MultiprocExecutor's shutdown
    ascend = _class(
        _member(ascend_091, "vllm_ascend/patch/platform/patch_multiproc_executor.py"),
        "AscendMultiprocExecutor",
    )
    assert [ast.unparse(b) for b in ascend.bases] == ["MultiprocExecutor"] and _method(
        ascend, "shutdown"
    ) is None


@pytest.mark.slow
def test_the_launchers_vllm_environment_on_0_23(vllm_091, ascend_091):
    """The Qwen launcher exports VLLM_ASCEND_ENABLE_NZ=0 (vllm-ascend 0.23.0.post1 still reads it, default 1) on every
    base, and VLLM_USE_V1=1 only on the vLLM 0.13 bases: vLLM 0.23.0 no longer has it (V1 is its only engine)."""
    launcher = (Path(__file__).resolve().parents[2] / "llm_rl/qwen2_5/run_qwen2_5_1_5b.sh").read_text()
    assert "export VLLM_ASCEND_ENABLE_NZ=0" in launcher
    envs = _member(ascend_091, "vllm_ascend/envs.py").replace("'", '"')
    assert 'int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1))' in envs
    assert "VLLM_USE_V1" not in _member(vllm_091, "vllm/envs.py")
    # the launcher's VLLM_USE_V1 line, run on each base (the dry runs: tests/launch/test_launch_bases.py)
    (line,) = [ln for ln in launcher.splitlines() if "export VLLM_USE_V1" in ln]
    for base, value in (("0.6.0", "1"), ("0.7.1", "1"), ("0.9.1", "unset")):
        script = f'VERL_BASE={base}; LAUNCH_ENV=(); {line}\necho "${{VLLM_USE_V1-unset}} ${{LAUNCH_ENV[*]}}"'
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={}).stdout.split()
        assert out == ([value, "VLLM_USE_V1"] if value == "1" else [value]), (base, out)
