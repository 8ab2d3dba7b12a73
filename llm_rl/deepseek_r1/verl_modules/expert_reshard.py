# Copyright 2025 ascend-rl-recipes maintainers
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Routed experts of the Megatron weight sync by AlltoAllV (rollout.expert_reshard=alltoallv).

The planner and executor are verl/utils/megatron/moe_reshard.py, which the overlay installs beside this module
(the recipe repository's ascend_rl/moe_reshard.py, one self-contained file); this module adapts them to each
base's Megatron export:

- verl 0.6.0 / 0.7.1 (ds-0006, ds-0106): per_tensor_generator, which passes what it reads from parallel_state in
  an ExpertSyncLayout and calls ExpertReshard.route per expert tensor;
- verl 0.9.1 (ds-0206): MegatronEngine.get_per_tensor_param, which exports through Megatron-Bridge
  (AutoBridge.export_hf_weights, one WeightConversionTask per parameter); export_hf_weights_alltoallv takes the
  routed-expert tasks out of the bridge's list, hands the rest to the bridge unchanged, and routes each expert
  task's local tensor (task.param_weight) itself, so neither the bridge's PP broadcast nor its EP all-gather
  (MegatronParamMapping.gather_from_ep_ranks) runs for routed experts.

Nothing here imports the recipe repository; megatron is imported only by layout_from_megatron (0.9.1's path).
"""

import importlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

REPORT_ENV_VAR = "RECIPE_RESHARD_REPORT"
MODULE = "verl.utils.megatron.moe_reshard"
_SYNCS = 0  # weight syncs this process has routed experts for


def load_moe_reshard():
    """The planner and executor installed beside this module (verl/utils/megatron/moe_reshard.py)."""
    try:
        return importlib.import_module(MODULE)
    except ImportError as exc:
        raise ImportError(
            f"{MODULE} cannot be imported ({exc}); the overlay installs it with this module: "
            "apply the recipe's series again (python3 -m ascend_rl overlay apply)"
        ) from None


@dataclass(frozen=True)
class ExpertSyncLayout:
    """This rank's view of the training (Megatron) and rollout (vLLM) parallel layouts."""

    world_size: int
    rank: int
    train_tp: int
    train_ep: int
    train_pp: int
    expert_tp: int
    ep_rank: int  # Megatron's expert-model-parallel rank of this rank
    pp_rank: int
    num_experts: int
    rollout_tp: int
    rollout_dp: int
    rollout_ep: int  # rollout.expert_parallel_size; 1 = vLLM EP off, every rank keeps every expert
    expert_placement: str = "linear"  # vLLM's expert_placement_strategy
    # the vLLM-Ascend setting that places experts otherwise (custom_expert_placement)
    custom_expert_map: str = ""


# vLLM-Ascend 0.13 additional_config keys under which its FusedMoE does not keep the contiguous expert blocks by EP
# rank that the plan assumes (eplb_utils.init_eplb_config, AscendFusedMoE.__init__): a placement file, redundant
# experts (init_redundancy_expert, used once dynamic_eplb or expert_map_record_path is on), experts moved while
# serving, shared experts mixed into the routed ones. An eplb_config dict replaces the top-level EPLB keys
# (AscendConfig.refresh_eplb_config), where the redundancy count is num_redundant_experts.
ASCEND_EPLB_KEYS = ("expert_map_path", "expert_map_record_path", "dynamic_eplb")


def custom_expert_placement(additional_config: Any) -> str:
    """The vLLM-Ascend settings that place experts outside contiguous EP blocks ("" when there are none)."""
    additional = dict(additional_config or {})
    eplb = additional.get("eplb_config", None)
    source = dict(eplb) if eplb is not None else additional
    prefix = "eplb_config." if eplb is not None else ""
    found = [prefix + key for key in ASCEND_EPLB_KEYS if source.get(key, None)]
    redundant = "num_redundant_experts" if eplb is not None else "init_redundancy_expert"
    if source.get(redundant, None):
        found.append(prefix + redundant)
    if additional.get("mix_placement", None):
        found.append("mix_placement")
    return ", ".join(found)


def layout_from_rollout_config(rollout_config: Any, **train: int) -> ExpertSyncLayout:
    """ExpertSyncLayout from the rollout config (omegaconf or dataclass) and the training sizes in `train`."""
    vllm_kwargs = (rollout_config.get("engine_kwargs", None) or {}).get("vllm", None) or {}
    additional = vllm_kwargs.get("additional_config", None) or {}
    return ExpertSyncLayout(
        rollout_tp=rollout_config.tensor_model_parallel_size,
        rollout_dp=rollout_config.data_parallel_size,
        rollout_ep=rollout_config.expert_parallel_size,
        expert_placement=vllm_kwargs.get("expert_placement_strategy", None) or "linear",
        custom_expert_map=custom_expert_placement(additional),
        **train,
    )


def _plan(mr, layout: ExpertSyncLayout):
    """(reason it cannot be used or None, whether the planner logged it, plan)."""
    if layout.expert_tp > 1:
        return f"expert tensor parallel size {layout.expert_tp} > 1", False, None
    if layout.expert_placement != "linear" or layout.custom_expert_map:
        why = layout.custom_expert_map or f"expert_placement_strategy={layout.expert_placement}"
        return (
            f"the rollout engine does not place experts in contiguous blocks by EP rank ({why})",
            False,
            None,
        )
    train = mr.TrainLayout(layout.world_size, tp=layout.train_tp, ep=layout.train_ep, pp=layout.train_pp)
    rollout_ep = layout.rollout_tp * layout.rollout_dp if layout.rollout_ep > 1 else 1
    try:
        plan = mr.plan_experts(train, mr.RolloutLayout(layout.world_size, ep=rollout_ep), layout.num_experts)
    except ValueError as exc:
        return str(exc), False, None
    if (train.ep_rank(layout.rank), train.stage(layout.rank)) != (layout.ep_rank, layout.pp_rank):
        return (
            (
                f"Megatron puts rank {layout.rank} at EP {layout.ep_rank} PP {layout.pp_rank}, "
                "not in the TP-innermost, PP-outermost order the plan assumes"
            ),
            False,
            None,
        )
    if plan.method != mr.ALLTOALLV:
        return plan.reason, True, None
    return None, False, plan


class ExpertReshard:
    """Moves each routed-expert tensor of the weight sync from its training holders to the rollout ranks keeping it."""

    def __init__(self, mr, plan, *, group=None, device=None, meter: dict | None = None):
        self.mr, self.plan, self.group, self.device = mr, plan, group, device
        self.meter = {} if meter is None else meter
        self.planned = {"sent": 0, "recv": 0}  # the planner's figures for the same calls

    def route(self, name: str, tensor: torch.Tensor | None, owner_stage: int, shape, dtype) -> list:
        """[(global expert name, tensor)] this rank's rollout engine keeps, from Megatron's `...weight<local id>`."""
        prefix, local_id = name.split(".weight")
        pairs = self.route_local(int(local_id), tensor, owner_stage, shape, dtype)
        return [(f"{prefix}.weight{expert}", t) for expert, t in pairs]

    def route_local(self, local_id: int, tensor: torch.Tensor | None, owner_stage: int, shape, dtype) -> list:
        """[(global expert id, tensor)] this rank's rollout engine keeps of the experts at local index `local_id`."""
        if local_id == 0:  # the planner's figures cover one (layer, parameter): all its local expert ids
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            step = self.mr.expert_step_traffic(self.plan, dist.get_rank(self.group), owner_stage, nbytes)
            for key in self.planned:
                self.planned[key] += step[key]
        return self.mr.route_expert_tensor(
            self.plan,
            owner_stage,
            local_id,
            tensor,
            shape=tuple(shape),
            dtype=dtype,
            device=self.device,
            group=self.group,
            meter=self.meter,
        )

    def report(self) -> dict:
        """This rank's routed-expert bytes of one sync against the plan's; a warning when they differ.

        With $RECIPE_RESHARD_REPORT set, each rank appends the figures to that file as one JSON line.
        """
        global _SYNCS
        _SYNCS += 1
        done = self.mr.totals(self.meter, "experts/")
        figures = {
            "rank": dist.get_rank(self.group),
            "sync": _SYNCS,
            "calls": done.calls,
            "recv_bytes": done.recv,
            "sent_bytes": done.sent,
            "plan_recv_bytes": self.planned["recv"],
            "plan_sent_bytes": self.planned["sent"],
        }
        if (done.recv, done.sent) != (self.planned["recv"], self.planned["sent"]):
            logger.warning("rollout.expert_reshard=alltoallv: bytes differ from the plan's: %s", figures)
        path = os.environ.get(REPORT_ENV_VAR)
        if path:
            # one short line per write: appends do not interleave
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(figures) + "\n")
        return figures


def make_expert_reshard(
    mode: str, layout: ExpertSyncLayout, *, group=None, device=None, meter: dict | None = None
) -> ExpertReshard | None:
    """The AlltoAllV router when `mode` is alltoallv and every rank can use it; None means the EP all-gather path.

    Collective over `group` when mode is alltoallv (the ranks agree on the path); logs one line when it falls back.
    """
    if mode not in ("allgather", "alltoallv"):
        raise ValueError(f"rollout.expert_reshard must be allgather or alltoallv, got {mode!r}")
    if mode == "allgather":
        return None
    mr = plan = None
    logged = False
    try:
        mr = load_moe_reshard()
    except ImportError as exc:
        reason = str(exc)
    else:
        reason, logged, plan = _plan(mr, layout)
    ok = torch.tensor([0 if reason else 1], dtype=torch.int32, device=device if device is not None else "cpu")
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if reason is None and not ok.item():
        reason = "another rank cannot use it (see its log line)"
    if reason is not None:
        if not logged:  # the planner already logged its own fallback line
            logger.warning(
                "rollout.expert_reshard=alltoallv: routed experts fall back to the EP all-gather: %s", reason
            )
        return None
    return ExpertReshard(mr, plan, group=group, device=device, meter=meter)


# ----------------------------------------------------------------------------- verl 0.9.1: Megatron-Bridge's export
#
# MegatronEngine.get_per_tensor_param exports through AutoBridge.export_hf_weights(module, conversion_tasks=...): one
# WeightConversionTask per Megatron parameter, the same global list on every rank (sorted by layer and expert
# number). A routed expert's task holds, on the PP stage that owns it, the local tensor of ONE local expert
# (task.param_weight: SequentialMLP's local_experts.<L>.linear_fcK.weight or the grouped linear_fcK.weight<L>)
# under the global name of this EP rank's expert (`...linear_fcK.weight<G>`, G = ep_rank * E/EP + L), and the HF
# name(s) of that expert in task.mapping.hf_param (a dict gate / up for the fused linear_fc1, a string for
# linear_fc2); off the owning stage param_weight is None. The bridge converts it by a PP broadcast, the expert-TP
# gather and an all-gather over EP (gather_from_ep_ranks), yielding every EP rank's expert at that local index.

EXPERT_NUMBER = re.compile(r"experts\.(\d+)")
# mappings whose megatron_to_hf, at expert TP 1, is the identity before gather_from_ep_ranks (hf_param a string) or a
# split of the fused tensor along dim 0 in hf_param's order (gate, up); any other expert mapping falls back
IDENTITY_MAPPINGS = (
    "AutoMapping",
    "ColumnParallelMapping",
    "RowParallelMapping",
    "DirectMapping",
    "ReplicatedMapping",
)
CHUNKED_MAPPINGS = {"GatedMLPMapping": ("gate", "up")}


def is_routed_expert_task(task: Any) -> bool:
    """True for a conversion task of a routed expert (the bridge's own test), adapters excluded."""
    mapping = getattr(task, "mapping", None)
    return mapping is not None and bool(mapping.is_expert) and not bool(mapping.is_adapter)


def split_conversion_tasks(tasks: list) -> tuple[list, list]:
    """(routed-expert tasks, the others), each in the bridge's order."""
    experts = [task for task in tasks if is_routed_expert_task(task)]
    rest = [task for task in tasks if not is_routed_expert_task(task)]
    return experts, rest


def local_expert_id(task: Any, experts_per_rank: int) -> int:
    """The local index of the task's expert: its global number (after .weight / .bias) modulo E/EP."""
    name = task.mapping.megatron_param
    for key in (".weight", ".bias"):
        if key in name:
            return int(name.split(key)[-1]) % experts_per_rank
    raise ValueError(f"{name}: no expert number after .weight or .bias")


def hf_templates(mapping: Any) -> tuple[str, ...] | None:
    """The HF names of one expert's pieces, in the order they lie along dim 0 of its tensor; None: unsupported."""
    kind = type(mapping).__name__
    hf_param = mapping.hf_param
    if kind in IDENTITY_MAPPINGS and isinstance(hf_param, str):
        return (hf_param,)
    keys = CHUNKED_MAPPINGS.get(kind)
    if keys is not None and isinstance(hf_param, dict) and set(hf_param) == set(keys):
        return tuple(hf_param[key] for key in keys)
    return None


def hf_pieces(
    templates: tuple[str, ...], expert: int, tensor: torch.Tensor
) -> list[tuple[str, torch.Tensor]]:
    """[(HF name, tensor)] of global expert `expert`: the bridge's names (experts.<id> replaced as
    gather_from_ep_ranks does) and its split of a fused tensor (torch.chunk along dim 0)."""
    parts = torch.chunk(tensor, len(templates), dim=0) if len(templates) > 1 else (tensor,)
    return [
        (EXPERT_NUMBER.sub(f"experts.{expert}", template), part)
        for template, part in zip(templates, parts, strict=True)
    ]


def expert_signature(task: Any, experts_per_rank: int) -> str:
    """The task's Megatron name with its expert number replaced by the local index: equal on every EP rank."""
    name = task.mapping.megatron_param
    for key in (".weight", ".bias"):
        if key in name:
            prefix = name.split(key)[0]
            return f"{prefix}{key}<{local_expert_id(task, experts_per_rank)}>"
    return name


def layout_from_megatron(rollout_config: Any, num_experts: int) -> ExpertSyncLayout:
    """ExpertSyncLayout from Megatron's parallel_state (initialised by the engine) and the rollout config."""
    from megatron.core import parallel_state as mpu

    return layout_from_rollout_config(
        rollout_config,
        world_size=dist.get_world_size(),
        rank=dist.get_rank(),
        train_tp=mpu.get_tensor_model_parallel_world_size(),
        train_ep=mpu.get_expert_model_parallel_world_size(),
        train_pp=mpu.get_pipeline_model_parallel_world_size(),
        expert_tp=mpu.get_expert_tensor_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        num_experts=num_experts,
    )


def _engine_refusal(engine: Any, rollout_config: Any) -> str | None:
    """Why the engine's export cannot take the AlltoAllV path (the same on every rank), or None."""
    if getattr(engine, "vanilla_bridge", False):
        return "the export is mbridge's (megatron.vanilla_mbridge=True), not Megatron-Bridge's"
    if getattr(engine, "peft_cls", None) is not None:
        return "LoRA: the bridge merges or exports adapters per task"
    if getattr(engine, "_qat_enabled", False):
        return "QAT: the export goes through QATWeightExporter"
    if (rollout_config.get("pipeline_model_parallel_size", 1) or 1) > 1:
        return "the rollout is pipeline-parallel (the plan assumes rollout PP 1)"
    return None


def export_hf_weights_alltoallv(engine: Any, default: Any, rollout_config: Any, *, meter: dict | None = None):
    """The engine's HF export with its routed experts by AlltoAllV; `default` (the bridge's own export) on fallback.

    `engine` is verl 0.9.1's MegatronEngine (or a subclass) after load_megatron_model_to_gpu. Collective: every rank
    calls it in the same sync. It agrees the path once (make_expert_reshard), then returns a generator that yields
    the bridge's export of every non-expert task (AutoBridge.export_hf_weights with the rest of the task list), then
    for each routed-expert task in the bridge's order the experts this rank's rollout engine keeps, under the names
    and in the pieces the bridge would yield, and finally checks its bytes against the plan (ExpertReshard.report).
    """
    mode = rollout_config.get("expert_reshard", "allgather")
    if mode not in ("allgather", "alltoallv"):
        raise ValueError(f"rollout.expert_reshard must be allgather or alltoallv, got {mode!r}")
    if mode == "allgather":
        return default
    reason = _engine_refusal(engine, rollout_config)
    tasks = None if reason else engine._mbridge_export_tasks()
    if reason is None and tasks is None:
        reason = "the bridge plans its own FP8 export tasks (export_weight_dtype=fp8)"
    experts = rest = []
    if reason is None:
        experts, rest = split_conversion_tasks(tasks)
        templates = [hf_templates(task.mapping) for task in experts]
        unsupported = sorted(
            {type(t.mapping).__name__ for t, tpl in zip(experts, templates, strict=True) if not tpl}
        )
        if not experts:
            reason = "the bridge's tasks hold no routed expert"
        elif unsupported:
            reason = (
                f"routed experts converted by {', '.join(unsupported)}, which this module does not reproduce"
            )
    if reason is not None:
        logger.warning(
            "rollout.expert_reshard=alltoallv: routed experts fall back to the EP all-gather: %s", reason
        )
        return default

    num_experts = engine.tf_config.num_moe_experts
    layout = layout_from_megatron(rollout_config, num_experts)
    owned = [task.param_weight is not None for task in experts]
    device = next((task.param_weight.device for task in experts if task.param_weight is not None), None)
    reshard = make_expert_reshard(mode, layout, device=device, meter=meter)
    if reshard is None:  # make_expert_reshard logged the line
        return default
    per = num_experts // layout.train_ep
    # which stage owns each expert task, its tensor's shape and dtype, and that every rank lists the same
    # (layer, parameter, local id) sequence: one object gather over the world per sync
    mine = [
        (
            expert_signature(task, per),
            layout.pp_rank if own else None,
            (tuple(task.param_weight.shape), str(task.param_weight.dtype)) if own else None,
        )
        for task, own in zip(experts, owned, strict=True)
    ]
    everyone: list = [None] * layout.world_size
    dist.all_gather_object(everyone, mine)
    if any([row[0] for row in theirs] != [row[0] for row in mine] for theirs in everyone):
        logger.warning(
            "rollout.expert_reshard=alltoallv: routed experts fall back to the EP all-gather: "
            "the ranks list the bridge's expert tasks in different orders"
        )
        return default
    owners, specs = [], []
    for index in range(len(experts)):
        found = {(row[index][1], row[index][2]) for row in everyone if row[index][1] is not None}
        if len(found) != 1:
            raise RuntimeError(
                f"{mine[index][0]}: held on stages with shapes {sorted(map(str, found))}, not one"
            )
        ((stage, (shape, dtype)),) = found
        owners.append(stage)
        specs.append((shape, getattr(torch, dtype.removeprefix("torch."))))

    def generate():
        yield from engine.bridge.export_hf_weights(engine.module, conversion_tasks=rest)
        for task, stage, (shape, dtype) in zip(experts, owners, specs, strict=True):
            local = None if task.param_weight is None else task.param_weight.detach()
            templates = hf_templates(task.mapping)
            for expert, tensor in reshard.route_local(local_expert_id(task, per), local, stage, shape, dtype):
                yield from hf_pieces(templates, expert, tensor)
        reshard.report()  # this rank's routed-expert bytes against the plan's

    return generate()
