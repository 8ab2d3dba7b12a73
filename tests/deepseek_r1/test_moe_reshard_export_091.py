"""Patch ds-0206 (routed experts of verl 0.9.1's Megatron engine export by AlltoAllV) and its adapter.

Three layers:

- form (CI tier): the patch applies and reverts byte-exact on the real verl 0.9.1 sdist on top of the DeepSeek 0.9.1
  series once the recipe has that base (else the Qwen 0.9.1 series' shared ports), and on top of the CPU overlay as
  well; the patched files compile; the patched RolloutConfig refuses a mode it does not know; the Megatron-Bridge
  lines the adapter re-does are the pinned wheel's;
- the adapter's pure logic (CI tier): the split of the bridge's conversion tasks, local expert ids, HF names and the
  gate/up chunking, the early fallbacks, on objects shaped like Megatron-Bridge 0.3.1's tasks (the real tasks run
  in the full tier);
- behaviour (full tier): moe_reshard_export_091.py on 2 gloo ranks, the real MegatronEngine on a tiny DeepSeek-V3
  at EP=2, exporting through the real Megatron-Bridge 0.3.1: the AlltoAllV export against the bridge's all-gather
  export in the same run (names kept, bit-equality, bytes against the planner, the collectives' buffer bytes), a
  rollout that keeps the other block, and two negative controls.
"""

from __future__ import annotations

import json
import logging
import os
import py_compile
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ascend_rl import artifacts, manifest, overlay
from ci_policy import get_artifact
from llm_rl.deepseek_r1.verl_modules import expert_reshard as er
from patched_tree import free_port, patched_copy

REPO = Path(__file__).resolve().parents[2]
BASE = "0.9.1"
PATCH = REPO / "llm_rl" / "deepseek_r1" / "patches" / "ds-0206-moe-reshard-weight-sync-091.patch"
DRIVER = Path(__file__).with_name("moe_reshard_export_091.py")


def recipe_on_091() -> str:
    """The recipe whose 0.9.1 series the tree carries: DeepSeek's once it has that base, else Qwen's (the shared
    ports; the Megatron engine's files are verl's own in both)."""
    return "deepseek_r1" if "0.9.1" in overlay.load_recipe("deepseek_r1").bases else "qwen2_5"


def _series(with_cpu: bool = False, with_patch: bool = True):
    """The 0.9.1 series without ds-0206 (wherever the recipe lists it) and the recipe's patches after it (ds-0204 and
    ds-0208 rest on its lines), then ds-0206 last when with_patch."""
    recipe = manifest.load_recipe(recipe_on_091(), BASE)
    names = [p.name for p in recipe.series]
    later = set(names[names.index(PATCH.name) + 1 :]) if PATCH.name in names else set()
    if with_cpu:
        recipe = manifest.with_overlay(recipe, "cpu")
    rest = tuple(p for p in recipe.series if p.name != PATCH.name and p.name not in later)
    return replace(recipe, series=(*rest, *([PATCH] if with_patch else [])))


def tree_hash(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- form (CI tier)


@pytest.mark.parametrize("with_cpu", [False, True], ids=["qwen-0.9.1-series", "with-cpu-overlay"])
def test_patch_applies_and_reverts_byte_exact_on_the_091_sdist(with_cpu, base_tree, pristine_base, tmp_path):
    # what ds-0206 changes: the series up to it on one copy, the whole series (ds-0206 last) on another
    prefix = base_tree(BASE)
    overlay.apply_series(_series(with_cpu, with_patch=False), prefix)
    before = tree_hash(prefix)
    tree = tmp_path / "whole"
    shutil.copytree(pristine_base(BASE), tree, symlinks=True)
    pristine = tree_hash(tree)
    recipe = _series(with_cpu)
    assert {s.state for s in overlay.series_status(recipe, tree)} == {"applicable"}
    overlay.apply_series(recipe, tree)
    assert [s.state for s in overlay.series_status(recipe, tree)] == ["applied"] * len(recipe.series)
    after = tree_hash(tree)
    changed = sorted(k for k in after if before.get(k) != after[k])
    assert changed == sorted(
        [
            "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
            "verl/trainer/config/_generated_ppo_torchtitan_trainer.yaml",
            "verl/trainer/config/_generated_ppo_trainer.yaml",
            "verl/trainer/config/_generated_ppo_veomni_trainer.yaml",
            "verl/trainer/config/rollout/rollout.yaml",
            "verl/utils/megatron/expert_reshard.py",
            "verl/utils/megatron/moe_reshard.py",
            "verl/workers/config/rollout.py",
            "verl/workers/engine/megatron/transformer_impl.py",
            "verl/workers/engine_workers.py",
        ]
    )
    # the installed modules are this repository's files, byte for byte
    assert after["verl/utils/megatron/moe_reshard.py"] == (REPO / "ascend_rl" / "moe_reshard.py").read_bytes()
    assert (
        after["verl/utils/megatron/expert_reshard.py"]
        == (REPO / "llm_rl" / "deepseek_r1" / "verl_modules" / "expert_reshard.py").read_bytes()
    )
    for rel in changed:
        if rel.endswith(".py"):
            py_compile.compile(str(tree / rel), doraise=True, cfile=str(tree / (rel + ".pyc-check")))
            (tree / (rel + ".pyc-check")).unlink()
    # every generated config lists the key once, under actor_rollout_ref.rollout, with the default
    for rel in changed:
        if "_generated_" in rel:
            assert after[rel].count(b"\n    expert_reshard: allgather\n") == 1, rel
    overlay.apply_series(recipe, tree)  # a second apply changes nothing
    assert tree_hash(tree) == after
    overlay.revert_series(recipe, tree)
    assert tree_hash(tree) == pristine


def test_the_engine_hunk_passes_the_rollout_config_only_on_the_colocated_path(base_tree):
    tree = base_tree(BASE)
    overlay.apply_series(_series(), tree)
    workers = (tree / "verl/workers/engine_workers.py").read_text()
    assert workers.count("rollout_config=self.config.rollout") == 1
    # the disaggregated path (checkpoint engine other than naive) keeps the bridge's export
    assert "per_tensor_param, _ = self.actor.engine.get_per_tensor_param()\n" in workers
    engine = (tree / "verl/workers/engine/megatron/transformer_impl.py").read_text()
    assert "def get_per_tensor_param(self, base_sync_done=False, rollout_config=None, **kwargs):" in engine
    assert "export_hf_weights_alltoallv(self, per_tensor_param, rollout_config)" in engine


def test_the_patched_rollout_config_refuses_an_unknown_mode(base_tree):
    tree = base_tree(BASE)
    overlay.apply_series(_series(), tree)
    code = (
        "from verl.workers.config import RolloutConfig\n"
        "print(RolloutConfig(name='vllm').expert_reshard)\n"
        "try:\n    RolloutConfig(name='vllm', expert_reshard='all2all')\n"
        "except ValueError as exc:\n    print('refused', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-2] == "allgather"
    assert (
        lines[-1].startswith("refused rollout.expert_reshard must be allgather") and "'all2all'" in lines[-1]
    )


# --------------------------------------------------------------------------- the adapter's pure logic (CI tier)
# Shaped as Megatron-Bridge 0.3.1's WeightConversionTask and mappings (model_bridge.py:89, param_mapping.py): the
# class names are what the adapter reads; is_expert / is_adapter as MegatronParamMapping defines them (:166).


@dataclass
class _Mapping:
    megatron_param: str
    hf_param: object

    @property
    def is_expert(self) -> bool:
        return (
            ".mlp.experts.linear_fc" in self.megatron_param
            or ".mlp.experts.local_experts." in self.megatron_param
        )

    @property
    def is_adapter(self) -> bool:
        return ".adapter." in self.megatron_param


class GatedMLPMapping(_Mapping):
    pass


class AutoMapping(_Mapping):
    pass


class QKVMapping(_Mapping):
    pass


def _task(mapping, weight=None):
    return SimpleNamespace(mapping=mapping, param_weight=weight, global_param_name=mapping.megatron_param)


def _fc1(g: int, layer: int = 1):
    hf = f"model.layers.{layer}.mlp.experts.{g}."
    return GatedMLPMapping(
        f"decoder.layers.{layer}.mlp.experts.linear_fc1.weight{g}",
        {"gate": hf + "gate_proj.weight", "up": hf + "up_proj.weight"},
    )


def _fc2(g: int, layer: int = 1):
    return AutoMapping(
        f"decoder.layers.{layer}.mlp.experts.linear_fc2.weight{g}",
        f"model.layers.{layer}.mlp.experts.{g}.down_proj.weight",
    )


def test_split_keeps_the_bridge_order_and_leaves_shared_experts_and_adapters_out():
    tasks = [
        _task(
            AutoMapping("decoder.layers.1.input_layernorm.weight", "model.layers.1.input_layernorm.weight")
        ),
        _task(_fc1(4)),
        _task(AutoMapping("decoder.layers.1.mlp.shared_experts.linear_fc2.weight", "x")),
        _task(_fc2(4)),
        _task(AutoMapping("decoder.layers.1.mlp.experts.linear_fc1.adapter.linear_in.weight", "y")),
        _task(_fc1(5)),
    ]
    experts, rest = er.split_conversion_tasks(tasks)
    assert experts == [tasks[1], tasks[3], tasks[5]]
    assert rest == [tasks[0], tasks[2], tasks[4]]


def test_local_expert_id_and_signature_agree_across_ep_ranks():
    # E = 8 over EP 2: EP rank 0 holds 0..3, EP rank 1 holds 4..7; task names carry the global id
    assert [er.local_expert_id(_task(_fc1(g)), 4) for g in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert er.expert_signature(_task(_fc1(1)), 4) == er.expert_signature(_task(_fc1(5)), 4)
    assert er.expert_signature(_task(_fc1(1)), 4) == "decoder.layers.1.mlp.experts.linear_fc1.weight<1>"
    assert er.expert_signature(_task(_fc1(1)), 4) != er.expert_signature(_task(_fc2(1)), 4)
    bias = AutoMapping("decoder.layers.1.mlp.experts.linear_fc2.bias6", "b")
    assert er.local_expert_id(_task(bias), 4) == 2


def test_hf_templates_by_mapping_kind():
    assert er.hf_templates(_fc1(5)) == (
        "model.layers.1.mlp.experts.5.gate_proj.weight",
        "model.layers.1.mlp.experts.5.up_proj.weight",
    )
    assert er.hf_templates(_fc2(5)) == ("model.layers.1.mlp.experts.5.down_proj.weight",)
    # a mapping whose conversion the adapter does not reproduce
    assert (
        er.hf_templates(QKVMapping("decoder.layers.1.mlp.experts.linear_fc1.weight0", {"q": "a", "k": "b"}))
        is None
    )
    assert er.hf_templates(GatedMLPMapping("x", {"gate": "a"})) is None


def test_hf_pieces_rename_and_chunk_as_the_bridge_does():
    fused = torch.arange(24.0).reshape(6, 4)  # [gate; up] along dim 0, as GatedMLPMapping's megatron weight
    pieces = er.hf_pieces(er.hf_templates(_fc1(1)), 6, fused)
    gate, up = torch.chunk(fused, 2, dim=0)  # param_mapping.py:2053
    assert [name for name, _ in pieces] == [
        "model.layers.1.mlp.experts.6.gate_proj.weight",
        "model.layers.1.mlp.experts.6.up_proj.weight",
    ]
    assert torch.equal(pieces[0][1], gate) and torch.equal(pieces[1][1], up)
    ((name, tensor),) = er.hf_pieces(er.hf_templates(_fc2(1)), 3, fused)
    assert name == "model.layers.1.mlp.experts.3.down_proj.weight" and tensor is fused


def _engine(**kw):
    fields = {"vanilla_bridge": False, "peft_cls": None, "_qat_enabled": False, "tasks": []}
    fields.update(kw)
    engine = SimpleNamespace(**fields)
    engine._mbridge_export_tasks = lambda: engine.tasks
    return engine


def _rollout(mode="alltoallv", **kw):
    return {
        "expert_reshard": mode,
        "tensor_model_parallel_size": 1,
        "data_parallel_size": 2,
        "expert_parallel_size": 2,
        **kw,
    }


@pytest.mark.parametrize(
    "engine,rollout,reason",
    [
        (_engine(vanilla_bridge=True), _rollout(), "mbridge's"),
        (_engine(peft_cls=object), _rollout(), "LoRA"),
        (_engine(_qat_enabled=True), _rollout(), "QAT"),
        (_engine(tasks=None), _rollout(), "FP8"),
        (_engine(tasks=[]), _rollout(), "no routed expert"),
        (
            _engine(tasks=[_task(QKVMapping("decoder.layers.1.mlp.experts.linear_fc1.weight0", {"q": "a"}))]),
            _rollout(),
            "QKVMapping",
        ),
        (_engine(), _rollout(pipeline_model_parallel_size=2), "pipeline-parallel"),
    ],
    ids=["mbridge", "lora", "qat", "fp8", "no-experts", "unknown-mapping", "rollout-pp"],
)
def test_early_fallbacks_hand_back_the_bridges_export_with_one_log_line(engine, rollout, reason, caplog):
    default = object()
    with caplog.at_level(logging.WARNING, logger=er.logger.name):
        assert er.export_hf_weights_alltoallv(engine, default, rollout) is default
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "fall back to the EP all-gather" in lines[0] and reason in lines[0], lines


def test_allgather_is_the_bridges_export_and_an_unknown_mode_is_refused(caplog):
    default = object()
    with caplog.at_level(logging.WARNING, logger=er.logger.name):
        assert er.export_hf_weights_alltoallv(_engine(), default, _rollout("allgather")) is default
    assert caplog.records == []
    with pytest.raises(ValueError, match="must be allgather or alltoallv"):
        er.export_hf_weights_alltoallv(_engine(), default, _rollout("all2all"))


def test_the_bridge_code_the_adapter_reproduces_is_the_pinned_wheels():
    """What the adapter re-does instead of the bridge, read in the pinned Megatron-Bridge wheel (constraints-0.9.1.txt):
    which tasks are experts, that expert mappings use the expert-TP group, the gate/up split of linear_fc1 and the
    renaming of one expert's HF name to each EP rank's. A wheel whose lines differ fails here first."""
    import zipfile

    version = artifacts.pinned("megatron-bridge", REPO / "constraints-0.9.1.txt")
    wheel = get_artifact(
        f"megatron-bridge {version}",
        artifacts.index_file,
        "megatron-bridge",
        f"megatron_bridge-{version}-py3-none-any.whl",
    )
    with zipfile.ZipFile(wheel) as zf:
        mapping = zf.read("megatron/bridge/models/conversion/param_mapping.py").decode()
        bridge = zf.read("megatron/bridge/models/conversion/model_bridge.py").decode()
    expected = [
        (
            mapping,
            'return ".mlp.experts.linear_fc" in self.megatron_param or ".mlp.experts.local_experts." in',
        ),
        (mapping, 'return ".adapter." in self.megatron_param'),
        (mapping, "        if self.is_expert:\n            return self._etp_group\n"),
        (mapping, "gate, up = torch.chunk(fused_mlp, 2, dim=0)"),
        (
            mapping,
            'gathered_gate_weights_dict = self.gather_from_ep_ranks(gate, megatron_module, self.hf_param["gate"])',
        ),
        (
            mapping,
            'gathered_up_weights_dict = self.gather_from_ep_ranks(up, megatron_module, self.hf_param["up"])',
        ),
        (mapping, "local_expert_number = global_expert_number % num_experts_per_rank"),
        (mapping, 'r"experts\\.(\\d+)", f"experts.{int(local_expert_number) + num_experts_per_rank * i}"'),
        (mapping, "return self.gather_from_ep_ranks(full_weights, megatron_module, self.hf_param)"),
        (
            bridge,
            "converted_weights_dict = task.mapping.megatron_to_hf(task.param_weight, task.megatron_module)",
        ),
    ]
    missing = [text for source, text in expected if text not in source]
    assert not missing, f"Megatron-Bridge {version} no longer has: {missing}"
    assert er.EXPERT_NUMBER.pattern == r"experts\.(\d+)"


# --------------------------------------------------------------------------- behaviour (full tier)


def make_tiny_deepseek(python: Path, out: Path) -> None:
    """ascend_rl.tiny.deepseek_v3's checkpoint under `python` (transformers 5.5.4 in the 0.9.1 environment)."""
    code = "import sys; from pathlib import Path; from ascend_rl.tiny.deepseek_v3 import make_checkpoint\n"
    code += "make_checkpoint(Path(sys.argv[1]))\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [str(python), "-c", code, str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def driver_setup(e2e_python_091, pristine_base, tmp_path_factory):
    """(python, tree, model, env, work): verl 0.9.1's e2e environment with the 0.9.1 Megatron packages on PYTHONPATH
    (as the harness' engine run has them), the tree with the CPU overlay and ds-0206, the recipe's CPU launch
    environment."""
    packages = get_artifact(
        "megatron-core / megatron-bridge (0.9.1)", artifacts.megatron_packages, e2e_python_091, "0.9.1"
    )
    work = tmp_path_factory.mktemp("reshard091")
    tree = patched_copy(pristine_base(BASE), work / "verl-tree", _series(with_cpu=True))
    model = work / "model"
    make_tiny_deepseek(e2e_python_091, model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(manifest.resolve_launch(recipe_on_091(), BASE, profile="cpu").cpu_env)
    env.update(
        PYTHONPATH=os.pathsep.join([str(tree), str(packages), str(REPO)]),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    return e2e_python_091, tree, model, env, work


def run_driver(setup, pp: int) -> dict[int, dict]:
    """moe_reshard_export_091.py on 2 gloo ranks at training PP `pp` (EP = 2 / pp); each rank's JSON."""
    python, tree, model, env, work = setup
    out = work / f"pp{pp}"
    proc = subprocess.run(
        [
            str(python), "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(DRIVER), "--tree", str(tree), "--model", str(model), "--work", str(out / "reports"),
            "--out", str(out / "out"), "--pp", str(pp),
        ],
        env=env, cwd=work, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = {r: json.loads((out / f"out.rank{r}.json").read_text()) for r in range(2)}
    print(f"ds-0206 on 2 gloo ranks, PP {pp}:", json.dumps(results, indent=1))
    return results


@pytest.fixture(scope="module")
def reshard_run(driver_setup) -> dict[int, dict]:
    """Training EP 2 (PP 1)."""
    return run_driver(driver_setup, pp=1)


@pytest.fixture(scope="module")
def reshard_run_pp2(driver_setup) -> dict[int, dict]:
    """Training PP 2 x EP 1: the MoE layer on stage 1, rank 1 holds every expert, rank 0 none."""
    return run_driver(driver_setup, pp=2)


RANKS = [0, 1]


def per_rank(test):
    """Full tier (the run needs the 0.9.1 e2e environment and ~2 minutes), once per rank's figures."""
    return pytest.mark.full(pytest.mark.slow(pytest.mark.parametrize("rank", RANKS)(test)))


def expert_bytes(run: dict) -> int:
    """One expert's gate + up + down bytes, from the shapes the bridge's export yielded."""
    return sum(run["expert_tensor_bytes"].values())


@per_rank
def test_rollout_ep2_each_rank_yields_exactly_its_block_bit_equal_without_collectives(reshard_run, rank):
    run = reshard_run[rank]
    assert run["world"] == 2 and run["num_experts"] == 8 and run["config_refuses_bogus"]
    got = run["alltoallv_ep2"]
    assert got["expert_names"] == run["allgather"]["kept_names"] == 12  # 4 experts x gate, up, down
    assert got["expert_names_equal_kept"] and got["experts_bit_equal"] and got["others_equal"]
    # the rollout keeps the block the rank trains: every expert is a local copy, the plan and the meter say 0
    assert got["plan"] == {"recv": 0, "sent": 0}
    assert [(r["recv_bytes"], r["plan_recv_bytes"], r["sent_bytes"]) for r in got["report"]] == [(0, 0, 0)]
    assert got["collective_bytes"] == 0 and got["collective_calls"] == 0


@per_rank
def test_the_allgather_export_materialises_every_expert_beside_it(reshard_run, rank):
    run = reshard_run[rank]
    gathered = run["allgather"]
    per_expert = expert_bytes(run)
    assert gathered["expert_names"] == 24  # every expert of the MoE layer on every rank
    # one all_gather over EP per (parameter, local expert id), gate and up apart: 4 x 3 calls, each output holds
    # both ranks' experts, i.e. every expert once
    assert gathered["by_op"] == {"all_gather": 8 * per_expert} and gathered["collective_calls"] == 12
    assert gathered["expert_collective_bytes"] == 8 * per_expert and gathered["expert_collective_calls"] == 12
    # alive at once while the consumer copies and drops each tensor: at least one all_gather's output (both ranks'
    # gate of one expert), against nothing on the AlltoAllV path
    assert gathered["expert_collective_peak_bytes"] >= 2 * run["expert_tensor_bytes"]["1.fc1"] // 2
    assert run["alltoallv_ep2"]["expert_collective_peak_bytes"] == 0


@per_rank
def test_rollout_without_ep_receives_the_other_block_by_alltoallv_with_the_planners_bytes(reshard_run, rank):
    run = reshard_run[rank]
    got = run["alltoallv_ep1"]
    per_expert = expert_bytes(run)
    assert got["expert_names"] == 24 and got["expert_names_equal_kept"]
    assert got["experts_bit_equal"] and got["others_equal"]
    assert got["plan"] == {"recv": 4 * per_expert, "sent": 4 * per_expert}
    (report,) = got["report"]
    assert (report["recv_bytes"], report["sent_bytes"]) == (got["plan"]["recv"], got["plan"]["sent"])
    assert (report["plan_recv_bytes"], report["plan_sent_bytes"]) == (
        got["plan"]["recv"],
        got["plan"]["sent"],
    )
    assert got["by_op"] == {"all_to_all_single": 8 * per_expert} and got["collective_calls"] == 8


@per_rank
def test_a_rollout_keeping_the_other_block_gets_it_and_fails_against_the_real_map(reshard_run, rank):
    run = reshard_run[rank]
    per_expert = expert_bytes(run)
    swapped = run["swapped_blocks"]
    assert (
        swapped["expert_names"] == 12 and swapped["expert_names_equal_kept"] and swapped["experts_bit_equal"]
    )
    assert swapped["plan"] == {"recv": 4 * per_expert, "sent": 4 * per_expert}
    (report,) = swapped["report"]
    assert (report["recv_bytes"], report["sent_bytes"]) == (4 * per_expert, 4 * per_expert)
    # negative control: the same export against the real block map (rank r keeps block r)
    control = run["swapped_blocks_against_the_real_map"]
    assert not control["expert_names_equal_kept"] and control["missing_kept"] and control["extra"]
    assert control["plan"]["recv"] == 0 != report["recv_bytes"]


@per_rank
def test_negative_control_a_wrong_local_expert_index_breaks_bit_equality(reshard_run, rank):
    control = reshard_run[rank]["wrong_local_id"]
    assert control["expert_names_equal_kept"] and control["others_equal"]
    assert not control["experts_bit_equal"] and control["experts_unequal"]


@pytest.mark.full
@pytest.mark.slow
def test_mbridge_falls_back_to_the_engines_own_export(reshard_run):
    assert [reshard_run[r]["fallback_is_default"] for r in RANKS] == ["DEFAULT", "DEFAULT"]


@per_rank
def test_pp2_each_rank_gets_its_block_from_the_owning_stage_without_the_pp_broadcast(reshard_run_pp2, rank):
    run = reshard_run_pp2[rank]
    assert (run["ep"], run["pp"], run["expert_tasks"]) == (1, 2, 16)  # fc1, fc2 of 8 experts, global over PP
    per_expert = expert_bytes(run)
    gathered, got = run["allgather"], run["alltoallv_ep2"]
    assert got["expert_names"] == gathered["kept_names"] == 12 and gathered["expert_names"] == 24
    assert got["expert_names_equal_kept"] and got["experts_bit_equal"] and got["others_equal"]
    # stage 1 (rank 1) holds all 8 experts and keeps 4..7; rank 0 (stage 0, no MoE layer) receives 0..3 from it
    plan = {"recv": 4 * per_expert, "sent": 0} if rank == 0 else {"recv": 0, "sent": 4 * per_expert}
    assert got["plan"] == plan
    (report,) = got["report"]
    assert (report["recv_bytes"], report["sent_bytes"]) == (plan["recv"], plan["sent"])
    assert (report["plan_recv_bytes"], report["plan_sent_bytes"]) == (plan["recv"], plan["sent"])
    # the bridge: every expert broadcast to stage 0, then an all_gather over the EP group of one per expert
    # tensor (gate and up apart); the adapter: rank 0's block by all_to_all_single, nothing on rank 1
    expected = 8 * per_expert + (8 * per_expert if rank == 0 else 0)
    assert gathered["expert_collective_bytes"] == expected
    assert got["expert_collective_bytes"] == (4 * per_expert if rank == 0 else 0)
    assert got["by_op"].get("broadcast", 0) == gathered["by_op"]["broadcast"] - (
        8 * per_expert if rank == 0 else 0
    )
    ep_off = run["alltoallv_ep1"]
    assert ep_off["expert_names"] == 24 and ep_off["experts_bit_equal"] and ep_off["expert_names_equal_kept"]
    assert ep_off["plan"] == (
        {"recv": 8 * per_expert, "sent": 0} if rank == 0 else {"recv": 0, "sent": 8 * per_expert}
    )
    assert [(r["recv_bytes"], r["sent_bytes"]) for r in ep_off["report"]] == [
        (ep_off["plan"]["recv"], ep_off["plan"]["sent"])
    ]


@per_rank
def test_pp2_negative_controls(reshard_run_pp2, rank):
    run = reshard_run_pp2[rank]
    assert not run["swapped_blocks_against_the_real_map"]["expert_names_equal_kept"]
    assert run["swapped_blocks"]["expert_names_equal_kept"] and run["swapped_blocks"]["experts_bit_equal"]
    assert not run["wrong_local_id"]["experts_bit_equal"]
