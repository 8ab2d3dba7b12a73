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
(the recipe repository's ascend_rl/moe_reshard.py, one self-contained file); this module adapts them to
per_tensor_generator. Neither imports the recipe repository nor megatron: the generator passes what it reads from
parallel_state in an ExpertSyncLayout.
"""

import importlib
import json
import logging
import math
import os
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
        if int(local_id) == 0:  # the planner's figures cover one (layer, parameter): all its local expert ids
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            step = self.mr.expert_step_traffic(self.plan, dist.get_rank(self.group), owner_stage, nbytes)
            for key in self.planned:
                self.planned[key] += step[key]
        pairs = self.mr.route_expert_tensor(
            self.plan,
            owner_stage,
            int(local_id),
            tensor,
            shape=tuple(shape),
            dtype=dtype,
            device=self.device,
            group=self.group,
            meter=self.meter,
        )
        return [(f"{prefix}.weight{expert}", t) for expert, t in pairs]

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
