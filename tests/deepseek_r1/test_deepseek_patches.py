"""The DeepSeek-R1 recipe's own verl patches and the shared on-policy check, on the patched sdist tree."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_rl import overlay

DP_MODULE = "verl/utils/vllm/ascend_dp.py"


@pytest.fixture(scope="module")
def patched(patched_verl) -> Path:
    """The deepseek_r1-patched verl 0.6.0 tree (shared, read only)."""
    return patched_verl("deepseek_r1")


@pytest.fixture(scope="module")
def dp(patched):
    spec = importlib.util.spec_from_file_location("ascend_dp", patched / DP_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _all_ranks(dp, world, local, tp, dpsize, env=None, ips=None):
    ips = ips or [f"10.0.0.{r // local}" for r in range(world)]
    return [dp.vllm_dp_env(r, world, local, tp, dpsize, ips, env or {}) for r in range(world)]


def test_dp_single_node_group(dp):
    envs = _all_ranks(dp, world=16, local=16, tp=2, dpsize=8)
    assert [e["VLLM_DP_RANK"] for e in envs] == [str(r // 2) for r in range(16)]
    assert envs[5]["VLLM_DP_RANK_LOCAL"] == "2"
    assert {e["VLLM_DP_SIZE"] for e in envs} == {"8"}
    assert {e["VLLM_DP_MASTER_IP"] for e in envs} == {"10.0.0.0"}
    assert {e["VLLM_DP_MASTER_PORT"] for e in envs} == {str(dp.DEFAULT_BASE_PORT)}


def test_dp_128_cards_one_port_per_group(dp):
    world, local, tp, dpsize = 128, 16, 4, 4  # 8 DP groups of 16 ranks, one per node
    envs = _all_ranks(dp, world, local, tp, dpsize)
    groups = {}
    for rank, e in enumerate(envs):
        groups.setdefault(rank // (tp * dpsize), set()).add(
            (e["VLLM_DP_MASTER_IP"], e["VLLM_DP_MASTER_PORT"])
        )
    assert all(len(v) == 1 for v in groups.values()), "members of one DP group disagree on the master"
    ports = [next(iter(v))[1] for v in groups.values()]
    assert len(set(ports)) == world // (tp * dpsize)
    gaps = sorted(int(p) for p in ports)
    assert min(b - a for a, b in zip(gaps, gaps[1:], strict=False)) >= dp.PORT_STRIDE
    assert envs[16]["VLLM_DP_MASTER_IP"] == "10.0.0.1" and envs[16]["VLLM_DP_RANK"] == "0"


def test_dp_group_spanning_nodes_uses_first_ranks_node(dp):
    envs = _all_ranks(dp, world=32, local=8, tp=2, dpsize=16)  # one group over 4 nodes
    assert {e["VLLM_DP_MASTER_IP"] for e in envs} == {"10.0.0.0"}
    assert [e["VLLM_DP_RANK"] for e in envs[8:10]] == ["4", "4"]
    assert [e["VLLM_DP_RANK_LOCAL"] for e in envs[8:12]] == ["0", "0", "1", "1"]


def test_dp_env_overrides(dp):
    env = {"VLLM_DP_MASTER_IP": "192.168.1.7", "VLLM_DP_MASTER_PORT": "40000"}
    envs = _all_ranks(dp, world=8, local=8, tp=1, dpsize=4, env=env)
    assert {e["VLLM_DP_MASTER_IP"] for e in envs} == {"192.168.1.7"}
    assert [envs[0]["VLLM_DP_MASTER_PORT"], envs[4]["VLLM_DP_MASTER_PORT"]] == [
        "40000",
        str(40000 + dp.PORT_STRIDE),
    ]


@pytest.mark.parametrize(("world", "tp", "dpsize"), [(12, 4, 2), (8, 0, 1)])
def test_dp_refuses_a_layout_that_does_not_divide(dp, world, tp, dpsize):
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        dp.vllm_dp_env(0, world, 8, tp, dpsize, ["h"] * world, {})


def test_rollout_sets_dp_env_and_ep(patched):
    src = (patched / "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py").read_text()
    assert "os.environ.update(self._vllm_dp_env(" in src
    assert 'engine_kwargs.setdefault("enable_expert_parallel"' in src
    # ds-0001 (an early vllm_ascend.patch import) is retired: vLLM-Ascend applies its patches itself
    # (tests/deepseek_r1/test_vllm_ascend_contract.py::test_vllm_ascend_applies_its_own_patches_before_use)
    assert "vllm_ascend" not in src


def test_patched_files_compile(patched):
    recipe = overlay.load_recipe("deepseek_r1", "0.6.0")
    touched = {fp.path for path in recipe.series for fp in overlay.patchset.parse(path).files}
    for rel in sorted(p for p in touched if p.endswith(".py")):
        compile((patched / rel).read_text(), rel, "exec")


def test_dp_and_patch_imports_resolve_against_vllm_wheel(patched, vllm_wheel, transformers_wheel):
    from ascend_rl import compat as check_imports

    report = check_imports.scan_tree(patched, [vllm_wheel, transformers_wheel])
    assert report.unresolved == [], report.unresolved


CONFIG_PROBE = r"""
import json, sys
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass, validate_config

tree, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for name, overrides, full in cases:
    with initialize_config_dir(config_dir=tree + "/verl/trainer/config", version_base=None):
        cfg = compose(config_name=name, overrides=overrides)
    try:
        if full:
            validate_config(cfg, use_reference_policy=True, use_critic=False)
        else:
            omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).validate(8, cfg.data.train_batch_size)
        extra = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.get("additional_config")
        out.append(["ok", None if extra is None else dict(extra)])
    except (ValueError, AssertionError) as exc:
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""

BASE = [
    "actor_rollout_ref.actor.recompute_old_log_prob=False",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=256",
]
CASES = {
    "on_policy": (["actor_rollout_ref.actor.ppo_mini_batch_size=256"], False),
    "two_mini_batches": (["actor_rollout_ref.actor.ppo_mini_batch_size=128"], False),
    "two_epochs": (
        ["actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_epochs=2"],
        False,
    ),
    "kl_in_reward": (
        ["actor_rollout_ref.actor.ppo_mini_batch_size=256", "algorithm.use_kl_in_reward=True"],
        True,
    ),
    "full_on_policy": (["actor_rollout_ref.actor.ppo_mini_batch_size=256"], True),
    "additional_config": (
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=256",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config={multistream_overlap_shared_expert:true}",
        ],
        False,
    ),
}


@pytest.fixture(scope="module")
def config_outcomes(patched) -> dict:
    """Compose verl's own trainer configs (FSDP and Megatron) on the patched tree and validate them."""
    cases, keys = [], []
    for name in ("ppo_trainer", "ppo_megatron_trainer"):
        for key, (overrides, full) in CASES.items():
            cases.append([name, BASE + overrides, full])
            keys.append((name, key))
    env = {**os.environ, "PYTHONPATH": str(patched)}
    proc = subprocess.run(
        [sys.executable, "-c", CONFIG_PROBE, str(patched), json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(keys, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_on_policy_skip_accepted(config_outcomes, trainer):
    assert config_outcomes[(trainer, "on_policy")][0] == "ok"
    assert config_outcomes[(trainer, "full_on_policy")][0] == "ok"


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_skip_refused_with_several_mini_batches(config_outcomes, trainer):
    state, msg = config_outcomes[(trainer, "two_mini_batches")]
    assert state == "refused"
    assert (
        "recompute_old_log_prob=False" in msg
        and "ppo_mini_batch_size (128) < data.train_batch_size (256)" in msg
    )


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_skip_refused_with_several_epochs(config_outcomes, trainer):
    state, msg = config_outcomes[(trainer, "two_epochs")]
    assert state == "refused" and "ppo_epochs (2) != 1" in msg


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_skip_refused_when_kl_in_reward_needs_old_log_probs(config_outcomes, trainer):
    state, msg = config_outcomes[(trainer, "kl_in_reward")]
    assert state == "refused" and "use_kl_in_reward" in msg


@pytest.mark.parametrize("trainer", ["ppo_trainer", "ppo_megatron_trainer"])
def test_additional_config_composes_without_plus(config_outcomes, trainer):
    assert config_outcomes[(trainer, "additional_config")] == [
        "ok",
        {"multistream_overlap_shared_expert": True},
    ]
    assert config_outcomes[(trainer, "on_policy")] == ["ok", None]


def test_additional_config_reaches_the_sync_engine_as_a_dict_only(patched):
    """verl forwards every non-null engine_kwargs.vllm entry: to LLM(...) as is, to the async server as str(v)."""
    spmd = (patched / "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py").read_text()
    server = (patched / "verl/workers/rollout/vllm_rollout/vllm_async_server.py").read_text()
    for src in (spmd, server):
        assert "engine_kwargs = {key: val for key, val in engine_kwargs.items() if val is not None}" in src
        assert "**engine_kwargs," in src
    # the async server's command line: a dict becomes its Python repr, which vLLM's JSON option parser refuses
    assert "server_args.append(str(v))" in server
    header = (overlay.REPO / "llm_rl/deepseek_r1/patches/ds-0003-vllm-additional-config.patch").read_text()
    assert "str(value)" in header and "as is in both" not in header
    for key in ("max_num_batched_tokens", "enable_chunked_prefill"):
        assert f"{key}=" in spmd and f'"{key}": self.config.{key}' in server
