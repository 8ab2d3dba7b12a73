"""ascend_rl/compat.py against verl 0.6.0 and the real vllm 0.13.0 / transformers 4.57.6 wheels.

The unpatched tree must report exactly the six known broken imports, the patched tree none:
the shared patch series is needed and enough.
"""

from __future__ import annotations

import ast
import py_compile
import re
from pathlib import Path

import pytest

from ascend_rl import compat as check_imports
from ascend_rl import overlay
from ascend_rl.cli import compat as check_imports_cli

SPMD = "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py"

KNOWN_BROKEN = {
    ("verl/workers/roles/utils/padding.py", "transformers.integrations.npu_flash_attention", "pad_input"),
    ("verl/workers/roles/utils/padding.py", "transformers.integrations.npu_flash_attention", "unpad_input"),
    (SPMD, "vllm.config", "CompilationLevel"),
    ("verl/utils/vllm/utils.py", "vllm.lora.models", "LoRAModel"),
    ("verl/workers/rollout/vllm_rollout/vllm_async_server.py", "vllm.utils", "FlexibleArgumentParser"),
    ("verl/workers/rollout/vllm_rollout/vllm_async_server.py", "vllm.utils", "get_tcp_uri"),
}
# 0.6.0 already falls back to vllm.v1.worker.worker_base when vllm.worker.worker_base is gone
KNOWN_GUARDED = (SPMD, "from vllm.worker.worker_base import WorkerWrapperBase")


def _key(finding: check_imports.Finding) -> tuple[str, str, str]:
    match = re.fullmatch(r"from (\S+) import (\S+)", finding.what)
    assert match, finding
    return finding.path, match.group(1), match.group(2)


@pytest.fixture(scope="module")
def wheels(vllm_wheel: Path, transformers_wheel: Path) -> list[Path]:
    return [vllm_wheel, transformers_wheel]


@pytest.fixture(scope="module")
def index(wheels: list[Path]):
    idx = check_imports.WheelIndex(wheels)
    yield idx
    idx.close()


def _series_files(repo_root: Path, recipe: overlay.Recipe) -> list[str]:
    files = []
    for rel in recipe.series:
        text = (repo_root / rel).read_text()
        files += [m for m in re.findall(r"^\+\+\+ b/(\S+)", text, re.M) if m.endswith(".py")]
    return sorted(set(files))


def test_unpatched_tree_has_exactly_the_six_broken_imports(pristine_verl: Path, wheels: list[Path]) -> None:
    report = check_imports.scan_tree(pristine_verl, wheels)
    assert {_key(f) for f in report.unresolved} == KNOWN_BROKEN
    assert len(report.unresolved) == 6
    assert (KNOWN_GUARDED[0], KNOWN_GUARDED[1]) in {(f.path, f.what) for f in report.guarded}
    assert report.checked > 100  # the scan really saw verl's vllm imports


@pytest.mark.parametrize("recipe_name", ["qwen2_5", "deepseek_r1"])
def test_series_leaves_no_broken_import(recipe_name: str, repo_root: Path, verl_tree: Path, wheels) -> None:
    recipe = overlay.load_recipe(recipe_name, "0.6.0")
    overlay.apply_series(recipe, verl_tree)
    report = check_imports.scan_tree(verl_tree, wheels)
    assert [str(f) for f in report.unresolved] == []
    assert (KNOWN_GUARDED[0], KNOWN_GUARDED[1]) in {(f.path, f.what) for f in report.guarded}
    touched = _series_files(repo_root, recipe)
    assert SPMD in touched
    for rel in touched:
        py_compile.compile(str(verl_tree / rel), doraise=True)


def test_patched_rollout_builds_compilation_config_with_an_existing_mode(
    repo_root: Path, verl_tree, index
) -> None:
    overlay.apply_series(overlay.load_recipe("qwen2_5", "0.6.0"), verl_tree)
    tree = ast.parse((verl_tree / SPMD).read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "CompilationConfig"
    ]
    assert len(calls) == 1
    kwargs = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert kwargs["mode"] == "CompilationMode.VLLM_COMPILE" and "level" not in kwargs
    res = index.resolve("vllm.config", "CompilationMode")
    assert res is not None and res.module == "vllm.config.compilation" and check_imports._is_enum(res.node)
    assert "VLLM_COMPILE" in check_imports._class_attributes(res.node)
    assert "PIECEWISE" not in check_imports._class_attributes(res.node)


def test_seed_text_substitution_is_caught_as_missing_enum_member(verl_tree: Path, wheels) -> None:
    path = verl_tree / SPMD
    path.write_text(path.read_text().replace("CompilationLevel", "CompilationMode"))  # the seed's sed
    report = check_imports.scan_tree(verl_tree, wheels)
    enum_findings = [f for f in report.unresolved if f.path == SPMD]
    assert [f.what for f in enum_findings] == ["CompilationMode.PIECEWISE"]
    assert "has no member PIECEWISE" in enum_findings[0].why


def test_lazy_modules_resolve_declared_names_only(index) -> None:
    assert index.resolve("vllm", "LLM") is not None  # vllm/__init__ serves it through __getattr__
    assert index.resolve("vllm.utils", "get_open_port") is not None  # a _DEPRECATED_MAPPINGS key
    assert index.resolve("vllm.utils", "get_tcp_uri") is None  # __getattr__ exists but does not serve it
    assert index.resolve("vllm.utils.network_utils", "get_tcp_uri").kind == "def"
    assert index.resolve("transformers.models.qwen2", "Qwen2ForCausalLM") is not None  # _LazyModule + star
    assert index.resolve("transformers.integrations.npu_flash_attention", "npu_flash_attn_func") is not None


def test_guards_are_recognised() -> None:
    source = (
        "try:\n    from vllm.gone import A\nexcept ImportError:\n    A = None\n"
        "if is_version_ge('vllm', '0.13'):\n    from vllm.new import B\nelse:\n    from vllm.old import B\n"
        "if is_npu_available:\n    from vllm.npu import C\n"
        "from transformers import AutoModel\n"
    )
    refs = {r.statement(): r.guard for r in check_imports.find_imports(source, "x.py")}
    assert refs == {
        "from vllm.gone import A": "try/except",
        "from vllm.new import B": "version check",
        "from vllm.old import B": "version check",
        "from vllm.npu import C": "",
    }


def test_an_except_fallback_counts_only_when_its_try_body_fails(index) -> None:
    # verl 0.7.1's verl/utils/vllm/utils.py: the new path first, the old one in the handler
    good = "try:\n    from vllm.lora.lora_model import LoRAModel\nexcept ImportError:\n    from vllm.lora.models import LoRAModel\n"
    report = check_imports.Report()
    check_imports.check_file(index, good, "ok.py", report)
    assert report.unresolved == [] and [f.what for f in report.guarded] == [
        "from vllm.lora.models import LoRAModel"
    ]
    # both paths gone: the fallback is what runs, and it is broken
    bad = "try:\n    from vllm.lora.gone import X\nexcept ImportError:\n    from vllm.lora.models import LoRAModel\n"
    report = check_imports.Report()
    check_imports.check_file(index, bad, "bad.py", report)
    assert [f.what for f in report.unresolved] == ["from vllm.lora.models import LoRAModel"]


def test_cli_lists_each_broken_import_and_exits_1(pristine_verl: Path, wheels, capsys) -> None:
    argv = [str(pristine_verl), "--vllm-wheel", str(wheels[0]), "--transformers-wheel", str(wheels[1])]
    assert check_imports_cli.main(argv) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("6 unresolved, 3 guarded")
    assert (
        "verl/utils/vllm/utils.py:18: from vllm.lora.models import LoRAModel: "
        "no module vllm.lora.models in the wheel (defined in vllm.lora.lora_model)"
    ) in lines


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys) -> None:
    assert check_imports_cli.main([str(tmp_path)]) == 2
    (tmp_path / "verl").mkdir()
    bogus = tmp_path / "not-a-wheel.whl"
    bogus.write_text("x")
    assert check_imports_cli.main([str(tmp_path), "--vllm-wheel", str(bogus)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    with pytest.raises(SystemExit) as exc:
        check_imports_cli.main([])
    assert exc.value.code == 2
