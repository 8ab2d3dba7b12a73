"""Source contracts: the vllm-ascend 0.13.0 (and vllm 0.13.0) internals the DeepSeek patches rely on or mirror.

The wheels are downloaded into the cache and read as source with `ast`; nothing here imports vllm or vllm_ascend
(vllm_ascend needs torch_npu). Each check states a fact a patch assumes; when a new release changes it, the failure
names the file and function to re-read. The behaviour these facts imply is run on CPU tensors in
tests/deepseek_r1/test_deepseek_weight_sync.py.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
import tarfile
import types
import zipfile
from functools import cache
from pathlib import Path

import pytest

from ascend_rl import artifacts, manifest
from ci_policy import get_artifact

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh"

FUSED_MOE = "vllm_ascend/ops/fused_moe/fused_moe.py"
WORKER = "vllm_ascend/worker/worker.py"
MLA = "vllm_ascend/attention/mla_v1.py"
PLATFORM = "vllm_ascend/platform.py"
ASCEND_CONFIG = "vllm_ascend/ascend_config.py"
EPLB_UTILS = "vllm_ascend/eplb/core/eplb_utils.py"
UTILS = "vllm_ascend/utils.py"
ENVS = "vllm_ascend/envs.py"


def _wheel(getter, what: str) -> Path:
    return get_artifact(what, getter)


def ascend_wheel_path() -> Path:
    """The vllm-ascend wheel pinned in constraints.txt (0.13.0; read as a zip, never imported); tests/ci_policy.py
    says when its absence is a skip."""
    return _wheel(artifacts.vllm_ascend_wheel, f"vllm-ascend {artifacts.pinned('vllm-ascend')} wheel")


def vllm_wheel_path() -> Path:
    """The vllm wheel pinned in constraints.txt (read as a zip); tests/ci_policy.py says when its absence is a skip."""
    return _wheel(lambda: artifacts.wheel("vllm", artifacts.pinned("vllm")), "vllm wheel")


@pytest.fixture(scope="session")
def vllm_ascend_wheel() -> Path:
    return ascend_wheel_path()


@pytest.fixture(scope="session")
def vllm_whl() -> Path:
    return vllm_wheel_path()


@cache
def _members(archive: Path) -> dict[str, str]:
    """An sdist's (tar) files by their path inside the package's top folder, read once."""
    with tarfile.open(archive) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode("utf-8-sig")
            for m in tar.getmembers()
            if m.isfile() and m.name.endswith(".py") and "/" in m.name
        }


def python_files(archive: Path) -> list[str]:
    """The .py paths of a wheel or an sdist, as `function` takes them."""
    if archive.name.endswith(".tar.gz"):
        return sorted(_members(archive))
    with zipfile.ZipFile(archive) as zf:
        return [n for n in zf.namelist() if n.endswith(".py")]


@cache
def _source(wheel: Path, path: str) -> str:
    """The text of `path` in a wheel (zip) or a source distribution (tar.gz: vllm-ascend 0.23.0.post1 has no wheel)."""
    if wheel.name.endswith(".tar.gz"):
        found = _members(wheel).get(path)
        if found is None:
            pytest.fail(
                f"{wheel.name} has no {path}: re-read where it moved and update the patch that mirrors it"
            )
        return found
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(path).decode("utf-8-sig")
        except KeyError:
            pytest.fail(
                f"{wheel.name} has no {path}: re-read where it moved and update the patch that mirrors it"
            )


def function(wheel: Path, path: str, qualname: str) -> ast.FunctionDef:
    """The function or method `qualname` ("Class.method" or "func") of `path` in the wheel, or a failure naming it."""
    body = ast.parse(_source(wheel, path)).body
    *classes, name = qualname.split(".")
    for cls in classes:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if body is None:
            pytest.fail(f"{wheel.name}: {path} has no class {cls}; re-read it")
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        pytest.fail(f"{wheel.name}: {path} has no {qualname}; re-read it")
    return found[-1]  # after any @overload stubs, the definition that runs


def where(wheel: Path, path: str, qualname: str) -> str:
    return f"{wheel.name}: re-read {path}:{qualname}"


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def _assignments(fn: ast.FunctionDef) -> dict[str, list[str]]:
    """target -> the unparsed values assigned to it in fn (in order)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found.setdefault(_text(target), []).append(_text(node.value))
    return found


def _calls(fn: ast.AST) -> list[str]:
    return [_text(n) for n in ast.walk(fn) if isinstance(n, ast.Call)]


# --- the fused MoE: transposed after loading, transposed back only by wake_up ----------------------------------


def test_unquantized_fused_moe_transposes_w13_and_w2_after_loading(vllm_ascend_wheel):
    fn = function(
        vllm_ascend_wheel, FUSED_MOE, "AscendUnquantizedFusedMoEMethod.process_weights_after_loading"
    )
    msg = where(vllm_ascend_wheel, FUSED_MOE, "AscendUnquantizedFusedMoEMethod.process_weights_after_loading")
    assigned = _assignments(fn)
    for name in ("w13", "w2"):
        data = assigned.get(f"{name}_data", [""])[0]
        assert f"layer.{name}_weight.data" in data and ".transpose(1, 2).contiguous()" in data, msg
        assert any(
            f"{name}_data" in v and "Parameter" in v for v in assigned.get(f"layer.{name}_weight", [])
        ), msg
    # sync_weights recognises the layer by this class name: the method AscendFusedMoE builds when unquantized
    init = function(vllm_ascend_wheel, FUSED_MOE, "AscendFusedMoE.__init__")
    assert "AscendUnquantizedFusedMoEMethod(self.moe_config)" in _calls(init), where(
        vllm_ascend_wheel, FUSED_MOE, "AscendFusedMoE.__init__"
    )


def test_moe_runtime_layout_is_what_the_kernels_read(vllm_ascend_wheel):
    """The grouped matmuls take w13/w2 as stored (need_trans defaults to False in the comm methods)."""
    src = _source(vllm_ascend_wheel, "vllm_ascend/ops/fused_moe/moe_comm_method.py")
    assert src.count("need_trans: bool = False") >= 1, f"{vllm_ascend_wheel.name}: re-read moe_comm_method.py"
    text = _text(function(vllm_ascend_wheel, FUSED_MOE, "AscendUnquantizedFusedMoEMethod.apply"))
    assert "w1=layer.w13_weight" in text and "w2=layer.w2_weight" in text, where(
        vllm_ascend_wheel, FUSED_MOE, "AscendUnquantizedFusedMoEMethod.apply"
    )


def test_only_wake_up_transposes_the_moe_weights_back(vllm_ascend_wheel):
    fn = function(vllm_ascend_wheel, WORKER, "NPUWorker.wake_up")
    msg = where(vllm_ascend_wheel, WORKER, "NPUWorker.wake_up")
    text = _text(fn)
    # the shape test sync_weights mirrors: run-time w2 is [E, I, H], run-time w13 is [E, H, 2I]
    assert "'w2_weight' in name and param.shape[2] == hidden_size" in text, msg
    assert "'w13_weight' in name and param.shape[1] == hidden_size" in text, msg
    assert text.count("param.transpose(1, 2)") == 2 and "setattr(parent_module, param_name" in text, msg
    assert "hidden_size = self.vllm_config.model_config.hf_text_config.hidden_size" in text, msg
    assert "if tags is None or 'weights' in tags" in text, msg
    # nowhere else in the package are w13/w2 transposed back: explicit offload (no wake_up) must do it itself
    with zipfile.ZipFile(vllm_ascend_wheel) as zf:
        py = [n for n in zf.namelist() if n.endswith(".py") and "quantization" not in n]
    transposing = []
    for path in py:
        tree = ast.parse(_source(vllm_ascend_wheel, path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                body = _text(node)
                if re.search(r"w(13|2)_(weight|data)", body) and ".transpose(1, 2)" in body:
                    transposing.append(f"{path}:{node.name}")
    assert sorted(transposing) == sorted(
        [f"{FUSED_MOE}:process_weights_after_loading", f"{WORKER}:wake_up"]
    ), f"{vllm_ascend_wheel.name}: MoE transposes moved; re-read {transposing}"


def test_sleep_mode_pool_and_nz_refusal(vllm_ascend_wheel):
    """Sleep mode is CaMemAllocator's; wake_up refuses FRACTAL_NZ, whose default is on."""
    load = _text(function(vllm_ascend_wheel, WORKER, "NPUWorker.load_model"))
    assert 'allocator.use_memory_pool(tag="weights")' in load.replace("'", '"'), where(
        vllm_ascend_wheel, WORKER, "NPUWorker.load_model"
    )
    sleep = _text(function(vllm_ascend_wheel, WORKER, "NPUWorker.sleep"))
    assert "allocator.sleep(offload_tags=('weights',) if level == 1 else tuple())" in sleep, where(
        vllm_ascend_wheel, WORKER, "NPUWorker.sleep"
    )
    wake = _text(function(vllm_ascend_wheel, WORKER, "NPUWorker.wake_up"))
    assert wake.index("envs_ascend.VLLM_ASCEND_ENABLE_NZ") < wake.index("raise ValueError")
    assert 'int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1))' in _source(vllm_ascend_wheel, ENVS).replace("'", '"')
    camem = _source(vllm_ascend_wheel, "vllm_ascend/device_allocator/camem.py")
    assert '"expandable_segments:True" not in conf' in camem, "camem.py: the README's allocator caveat moved"


# --- MLA: W_UV / W_UK_T derived from kv_b_proj -------------------------------------------------------------------


def test_mla_derives_w_uv_and_w_uk_t_from_kv_b_proj(vllm_ascend_wheel):
    fn = function(vllm_ascend_wheel, MLA, "AscendMLAImpl.process_weights_after_loading")
    msg = where(vllm_ascend_wheel, MLA, "AscendMLAImpl.process_weights_after_loading")
    assigned = _assignments(fn)
    assert any("self.kv_b_proj.weight.data" in v for v in assigned.get("kv_b_proj_weight", [])), msg
    assert "kv_b_proj_weight.split" in assigned.get("(W_UK, W_UV)", [""])[0], msg
    assert assigned.get("self.W_UV", [""])[0] == "W_UV.transpose(0, 1).contiguous()", msg
    assert assigned.get("self.W_UK_T", [""])[0] == "W_UK.permute(1, 2, 0).contiguous()", msg
    # ... and the forward reads the derived copies, not kv_b_proj
    assert "self.W_UV" in _text(function(vllm_ascend_wheel, MLA, "AscendMLAImpl._v_up_proj")), msg
    assert "self.W_UK_T" in _text(function(vllm_ascend_wheel, MLA, "AscendMLAImpl._q_proj_and_k_up_proj")), (
        msg
    )


def test_deepseek_attention_runs_on_the_mla_backend(vllm_ascend_wheel):
    fn = function(vllm_ascend_wheel, PLATFORM, "NPUPlatform.get_attn_backend_cls")
    assert "(True, False): 'vllm_ascend.attention.mla_v1.AscendMLABackend'" in _text(fn), where(
        vllm_ascend_wheel, PLATFORM, "NPUPlatform.get_attn_backend_cls"
    )
    impl = _text(function(vllm_ascend_wheel, MLA, "AscendMLABackend.get_impl_cls"))
    assert "return AscendMLAImpl" in impl


def test_vllm_runs_attention_post_load_through_the_layer(vllm_whl):
    """vLLM's loader calls layer.process_weights_after_loading(dtype) on Attention / MLAAttention, which calls impl's."""
    path = "vllm/model_executor/model_loader/utils.py"
    text = _text(function(vllm_whl, path, "process_weights_after_loading"))
    assert "isinstance(module, (Attention, MLAAttention))" in text
    assert "module.process_weights_after_loading(model_config.dtype)" in text
    layer = _text(function(vllm_whl, "vllm/attention/layer.py", "MLAAttention.process_weights_after_loading"))
    assert "self.impl.process_weights_after_loading(act_dtype)" in layer


# --- ds-0001 retired: vLLM-Ascend applies its patches itself -------------------------------------------------------


def test_vllm_ascend_applies_its_own_patches_before_use(vllm_ascend_wheel, vllm_whl):
    pre = _text(function(vllm_ascend_wheel, PLATFORM, "NPUPlatform.pre_register_and_update"))
    assert "adapt_patch(is_global_patch=True)" in pre, where(
        vllm_ascend_wheel, PLATFORM, "pre_register_and_update"
    )
    init = _text(function(vllm_ascend_wheel, WORKER, "NPUWorker.__init__"))
    assert init.index("adapt_patch()") < init.index("super().__init__("), where(
        vllm_ascend_wheel, WORKER, "__init__"
    )
    adapt = _text(function(vllm_ascend_wheel, UTILS, "adapt_patch"))
    assert (
        "from vllm_ascend.patch import platform" in adapt and "from vllm_ascend.patch import worker" in adapt
    )
    engine = _text(function(vllm_whl, "vllm/engine/arg_utils.py", "EngineArgs.create_engine_config"))
    assert "current_platform.pre_register_and_update()" in engine


def _rebound_module_names(wheel: Path) -> set[str]:
    """Names vllm-ascend's patch modules rebind on a vllm module (not methods replaced on a class in place)."""
    with zipfile.ZipFile(wheel) as zf:
        paths = [n for n in zf.namelist() if n.startswith("vllm_ascend/patch/") and n.endswith(".py")]
    names = set()
    for path in paths:
        tree = ast.parse(_source(wheel, path))
        for node in itertools.chain(tree.body, *(n.body for n in tree.body if isinstance(n, ast.If))):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    base = target.value
                    root = base.id if isinstance(base, ast.Name) else _text(base)
                    if isinstance(base, ast.Name) and root[:1].isupper():
                        continue  # Class.method = ...: patched in place, whoever bound the class sees it
                    names.add(target.attr)
    return names


def test_verl_binds_no_name_vllm_ascend_rebinds(vllm_ascend_wheel, patched_verl):
    """Why ds-0001 could go: import order only matters for names verl binds that a patch later rebinds."""
    rebound = _rebound_module_names(vllm_ascend_wheel)
    assert {"rejection_sample", "DeepseekV2MoE", "ECExampleConnector"} <= rebound  # the scan sees them
    tree = patched_verl("deepseek_r1")
    bound = set()
    for path in (tree / "verl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                bound |= {alias.name for alias in node.names}
    assert {"LLM", "SamplingParams"} <= bound
    assert bound & rebound == set(), (
        "verl binds names vllm-ascend rebinds; an early vllm_ascend.patch import is due"
    )


# --- ds-0002: what vLLM 0.13 reads of VLLM_DP_* under the external launcher --------------------------------------


def test_external_launcher_dp_reads_env_and_reuses_the_dp_group(vllm_whl, vllm_ascend_wheel):
    post = function(vllm_whl, "vllm/config/parallel.py", "ParallelConfig.__post_init__")
    branch = next(
        n
        for n in ast.walk(post)
        if isinstance(n, ast.If) and _text(n.test).startswith("self.data_parallel_size > 1")
    )
    fallback = _text(ast.Module(body=branch.orelse, type_ignores=[]))
    for field, env in (
        ("data_parallel_size", "VLLM_DP_SIZE"),
        ("data_parallel_rank", "VLLM_DP_RANK"),
        ("data_parallel_rank_local", "VLLM_DP_RANK_LOCAL"),
        ("data_parallel_master_ip", "VLLM_DP_MASTER_IP"),
        ("data_parallel_master_port", "VLLM_DP_MASTER_PORT"),
    ):
        assert f"self.{field} = envs.{env}" in fallback, where(
            vllm_whl, "vllm/config/parallel.py", "__post_init__"
        )
    engine = _text(function(vllm_whl, "vllm/v1/engine/llm_engine.py", "LLMEngine.__init__"))
    assert "self.dp_group = get_dp_group().cpu_group" in engine and "not self.external_launcher_dp" in engine
    init = _text(function(vllm_whl, "vllm/distributed/parallel_state.py", "init_distributed_environment"))
    assert (
        "distributed_executor_backend != 'external_launcher'" in init
    )  # no DP rendezvous at the master address
    with zipfile.ZipFile(vllm_ascend_wheel) as zf:
        py = [n for n in zf.namelist() if n.endswith(".py")]
    readers = [p for p in py if re.search(r"data_parallel_master_(ip|port)", _source(vllm_ascend_wheel, p))]
    assert readers == [], (
        f"vllm-ascend now reads the DP master address in {readers}: revise ds-0002's description"
    )


# --- additional_config keys: the launcher's, and the placement keys ds-0006 refuses --------------------------------


def _ascend_config_keys(wheel: Path) -> set[str]:
    keys = set()
    for qual in ("AscendConfig.__init__", "AscendConfig.refresh_eplb_config"):
        for call in ast.walk(function(wheel, ASCEND_CONFIG, qual)):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "get"
                and _text(call.func.value) in ("additional_config", "config")
                and call.args
                and isinstance(call.args[0], ast.Constant)
            ):
                keys.add(call.args[0].value)
    return keys


@pytest.mark.parametrize("base", manifest.load_recipe("deepseek_r1").bases)
def test_launcher_additional_config_keys_exist(vllm_ascend_wheel, base):
    """The additional_config the launcher sets on each base (its recipe.toml overrides, through `resolve`)."""
    overrides = " ".join(manifest.resolve_launch("deepseek_r1", base).overrides)
    match = re.search(r"additional_config=\{([^}]*)\}", overrides)
    assert match, f"the launcher sets no additional_config on {base}"
    launcher_keys = {item.split(":")[0].strip() for item in match.group(1).split(",")}
    assert launcher_keys and launcher_keys <= _ascend_config_keys(vllm_ascend_wheel), where(
        vllm_ascend_wheel, ASCEND_CONFIG, "AscendConfig.__init__"
    )


@pytest.fixture(scope="module")
def expert_reshard(patched_verl):
    path = patched_verl("deepseek_r1") / "verl/utils/megatron/expert_reshard.py"
    spec = importlib.util.spec_from_file_location("expert_reshard_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_placement_guard_covers_what_init_eplb_config_reads(vllm_ascend_wheel, expert_reshard):
    eplb = _text(function(vllm_ascend_wheel, EPLB_UTILS, "init_eplb_config"))
    read = set(re.findall(r"ascend_config\.(\w+)", eplb))
    assert read == {"expert_map_path", "dynamic_eplb", "expert_map_record_path", "init_redundancy_expert"}, (
        where(vllm_ascend_wheel, EPLB_UTILS, "init_eplb_config")
    )
    moe_init = _text(function(vllm_ascend_wheel, FUSED_MOE, "AscendFusedMoE.__init__"))
    assert "getattr(ascend_config, 'mix_placement', False)" in moe_init
    keys = _ascend_config_keys(vllm_ascend_wheel)
    top = {
        "expert_map_path",
        "expert_map_record_path",
        "dynamic_eplb",
        "init_redundancy_expert",
        "mix_placement",
    }
    nested = {"expert_map_path", "expert_map_record_path", "dynamic_eplb", "num_redundant_experts"}
    assert top | nested | {"eplb_config"} <= keys, where(vllm_ascend_wheel, ASCEND_CONFIG, "AscendConfig")
    guard = expert_reshard.custom_expert_placement
    for key in top:
        assert key in guard({key: 4 if "redund" in key else "x"}), key
    for key in nested:
        assert f"eplb_config.{key}" in guard({"eplb_config": {key: 4 if "redund" in key else "x"}}), key
    # refresh_eplb_config replaces the top-level keys: an empty eplb_config clears them
    assert guard({"expert_map_path": "x", "eplb_config": {}}) == ""
    assert guard({}) == guard(None) == guard({"multistream_overlap_shared_expert": True}) == ""


def test_placement_guard_makes_the_reshard_fall_back(expert_reshard):
    layout = expert_reshard.layout_from_rollout_config(
        types.SimpleNamespace(
            tensor_model_parallel_size=2,
            data_parallel_size=4,
            expert_parallel_size=8,
            get=lambda key, default=None: (
                {"vllm": {"additional_config": {"expert_map_record_path": "/tmp/m"}}}
                if key == "engine_kwargs"
                else default
            ),
        ),
        world_size=8,
        rank=0,
        train_tp=1,
        train_ep=8,
        train_pp=1,
        expert_tp=1,
        ep_rank=0,
        pp_rank=0,
        num_experts=16,
    )
    reason, logged, plan = expert_reshard._plan(None, layout)
    assert plan is None and not logged and "expert_map_record_path" in reason


# --- vLLM 0.13's scheduler budget, which ds-0007 mirrors -----------------------------------------------------------


def test_token_budget_matches_vllm_verify_max_model_len(vllm_whl, patched_verl):
    fn = function(vllm_whl, "vllm/config/scheduler.py", "SchedulerConfig.verify_max_model_len")
    fn.returns = None
    namespace = {"logger": types.SimpleNamespace(warning=lambda *a, **k: None)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "scheduler.py", "exec"), namespace)
    verify = namespace["verify_max_model_len"]
    path = patched_verl("deepseek_r1") / "verl/utils/vllm/token_budget.py"
    spec = importlib.util.spec_from_file_location("token_budget_under_test", path)
    budget = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(budget)

    outcomes = set()
    for tokens, model_len, chunked, seqs in itertools.product(
        (256, 1024, 4096, 8192), (1024, 4096), (True, False), (256, 1024, 2048)
    ):
        config = types.SimpleNamespace(
            max_num_batched_tokens=tokens,
            enable_chunked_prefill=chunked,
            max_num_seqs=seqs,
            max_num_partial_prefills=1,
            max_long_partial_prefills=1,
            long_prefill_token_threshold=0,
        )
        try:
            verify(config, model_len)
            vllm_refuses = False
        except ValueError:
            vllm_refuses = True
        ours = budget.token_budget_problem(tokens, model_len, chunked, seqs) is not None
        assert ours == vllm_refuses, (tokens, model_len, chunked, seqs)
        outcomes.add(vllm_refuses)
    assert outcomes == {True, False}
    # the seed's real-weight setting is one vLLM accepts
    assert budget.token_budget_problem(1024, 1024 + 3072, True, 1024) is None
