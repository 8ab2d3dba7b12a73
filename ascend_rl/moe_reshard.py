"""Train-to-rollout weight reshard for DeepSeek MoE models: planner, executor and all-gather baseline.

After every update the Megatron training layout (TP x EP x PP) is copied into the vLLM-Ascend
rollout layout (EP over the whole world, PP1) on the same cards (colocated: global rank r is
training rank r and rollout rank r). Two optimisations from the cann-recipes-train write-up:

1. Routed experts: every expert goes from ONE training rank that holds it straight to the
   rollout rank(s) that need it, in one AlltoAllV per (layer, parameter), instead of an
   all-gather of all experts over the EP group on every card.
2. TP-split dense parameters across PP: all-gather inside TP first, then one exchange over PP
   moves p parameters at once, instead of a broadcast over PP per parameter followed by an
   all-gather over TP on every PP rank.

Byte accounting (the planner's figures and the executor's meter use the same definitions):

* ``sent`` / ``recv``: bytes this rank gives to / gets from OTHER ranks through a collective,
  i.e. the point-to-point payload the collective must deliver whatever its algorithm.
  Self-copies (an expert a rank both holds and needs) are excluded. all_gather over g ranks
  with shard b: sent = recv = (g-1)*b. broadcast of B over g ranks: root sent = (g-1)*B,
  others recv = B. all_to_all_single: the input splits to other ranks / output splits from
  other ranks.
* ``buffer``: bytes of the collective's output on this rank (for a broadcast, the tensor).
  Summed over the first step of part 2 this is the write-up's "step-1 traffic per card".
* ``peak_extra``: the largest transient memory one (layer, parameter) step allocates before the
  result is loaded into the rollout weights: the all-gather buffer of all experts (baseline), or
  the AlltoAllV output plus a packed send buffer when the sends are not one contiguous slice of
  the local expert tensor (plan).

The planner is pure Python (no torch). The executor imports torch lazily and uses
``all_to_all_single`` (supported on hccl and nccl, and on gloo in torch 2.13, where it was
checked), ``all_gather`` and ``broadcast``. The PP exchange of part 2 sends the same tensor to every
PP peer, so it is issued as an ``all_gather`` over the PP group (identical payload to the
AlltoAll, no copies of the send buffer; gloo's list all_to_all refuses unequal sizes).
Parameters of a stage with no equal-sized partner in every other stage go by broadcast.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}

ALLTOALLV = "alltoallv"
ALLGATHER = "allgather"


# ----------------------------------------------------------------------------- layouts


def _split_counts(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


@dataclass(frozen=True)
class TrainLayout:
    """Megatron training layout: TP x DP inside a PP stage, EP innermost for experts (expert TP 1)."""

    world_size: int
    tp: int = 1
    ep: int = 1
    pp: int = 1
    # experts held by each EP rank (index = EP rank); None = contiguous blocks (Megatron default)
    placement: tuple[tuple[int, ...], ...] | None = None
    # decoder layers per PP stage; None = an even split, earlier stages take the remainder
    layers_per_stage: tuple[int, ...] | None = None

    def check(self, num_experts: int) -> None:
        """Raise ValueError when the layout cannot exist."""
        for name in ("world_size", "tp", "ep", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"training {name} must be >= 1, got {getattr(self, name)}")
        if self.world_size % (self.tp * self.pp):
            raise ValueError(
                f"training world {self.world_size} is not a multiple of TP*PP = {self.tp * self.pp}"
            )
        if self.stage_size % self.ep:
            raise ValueError(
                f"training EP {self.ep} does not divide the {self.stage_size} ranks of a PP stage"
            )
        if self.placement is None:
            if num_experts % self.ep:
                raise ValueError(f"{num_experts} experts do not split evenly over training EP {self.ep}")
            return
        if len(self.placement) != self.ep:
            raise ValueError(f"placement lists {len(self.placement)} EP ranks, layout has EP {self.ep}")
        flat = sorted(x for block in self.placement for x in block)
        if flat != list(range(num_experts)):
            raise ValueError("placement must hold every expert exactly once across the EP ranks")
        if len({len(block) for block in self.placement}) != 1:
            raise ValueError("placement must give every EP rank the same number of experts")

    @property
    def stage_size(self) -> int:
        return self.world_size // self.pp

    def stage(self, rank: int) -> int:
        return rank // self.stage_size

    def stage_ranks(self, stage: int) -> range:
        return range(stage * self.stage_size, (stage + 1) * self.stage_size)

    def tp_rank(self, rank: int) -> int:
        return rank % self.stage_size % self.tp

    def ep_rank(self, rank: int) -> int:
        return rank % self.stage_size % self.ep

    def experts_held(self, rank: int, num_experts: int) -> tuple[int, ...]:
        """Global expert ids this rank holds for the MoE layers of its stage, in local order."""
        k = self.ep_rank(rank)
        if self.placement is not None:
            return tuple(self.placement[k])
        per = num_experts // self.ep
        return tuple(range(k * per, (k + 1) * per))

    def tp_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(start, start + self.tp)) for start in range(0, self.world_size, self.tp)]

    def pp_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(local, self.world_size, self.stage_size)) for local in range(self.stage_size)]

    def ep_groups(self) -> list[tuple[int, ...]]:
        return [tuple(range(start, start + self.ep)) for start in range(0, self.world_size, self.ep)]

    def layer_split(self, num_layers: int) -> tuple[int, ...]:
        if self.layers_per_stage is None:
            return _split_counts(num_layers, self.pp)
        if len(self.layers_per_stage) != self.pp or sum(self.layers_per_stage) != num_layers:
            raise ValueError(
                f"layers_per_stage {self.layers_per_stage} must list {self.pp} stages summing to {num_layers}"
            )
        return self.layers_per_stage

    def stage_of_layer(self, layer: int, num_layers: int) -> int:
        """PP stage owning decoder layer `layer`; -1 (embedding) is the first, >= num_layers the last."""
        if layer < 0:
            return 0
        if layer >= num_layers:
            return self.pp - 1
        end = 0
        for stage, count in enumerate(self.layer_split(num_layers)):
            end += count
            if layer < end:
                return stage
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class RolloutLayout:
    """vLLM-Ascend rollout layout: PP1, experts in contiguous blocks over EP; rank r is EP rank r % ep."""

    world_size: int
    ep: int

    def check(self, num_experts: int) -> None:
        """Raise ValueError when the layout cannot exist."""
        if self.ep < 1 or self.world_size % self.ep:
            raise ValueError(f"rollout EP {self.ep} must divide the rollout world {self.world_size}")
        if num_experts % self.ep:
            raise ValueError(f"{num_experts} experts do not split evenly over rollout EP {self.ep}")

    def experts_needed(self, rank: int, num_experts: int) -> tuple[int, ...]:
        per = num_experts // self.ep
        k = rank % self.ep
        return tuple(range(k * per, (k + 1) * per))


# ----------------------------------------------------------------------------- model description


@dataclass(frozen=True)
class ExpertParam:
    """One routed-expert weight; `shape` is ONE expert's shape."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "bfloat16"

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class DenseParam:
    """One non-expert weight (full shape); `tp_dim` is the dimension Megatron splits over TP, or None."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = None
    dtype: str = "bfloat16"
    layer: int = 0  # decoder layer; -1 = before the first layer, >= num_layers = after the last

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * DTYPE_BYTES[self.dtype]

    def shard_shape(self, tp: int) -> tuple[int, ...]:
        if self.tp_dim is None or tp == 1:
            return self.shape
        shape = list(self.shape)
        if shape[self.tp_dim] % tp:
            raise ValueError(f"{self.name}: dim {self.tp_dim} of {self.shape} does not split over TP {tp}")
        shape[self.tp_dim] //= tp
        return tuple(shape)


@dataclass(frozen=True)
class ModelSpec:
    """The shapes the reshard moves: routed experts of the MoE layers, and the dense parameters."""

    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    expert_params: tuple[ExpertParam, ...]
    dense_params: tuple[DenseParam, ...] = ()


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def deepseek_v3_spec(*, with_dense: bool = True) -> ModelSpec:
    """DeepSeek-V3 shapes: 61 layers (0-2 dense MLP, 3-60 MoE), 256 routed experts, hidden 7168, bf16."""
    hidden, moe_ffn, dense_ffn, heads, vocab = 7168, 2048, 18432, 128, 129280
    q_lora, kv_lora, nope, rope, v_dim = 1536, 512, 128, 64, 128
    n, first_moe = 61, 3
    experts = (
        ExpertParam("mlp.experts.w1", (2 * moe_ffn, hidden)),  # fused gate/up
        ExpertParam("mlp.experts.w2", (hidden, moe_ffn)),
    )
    dense: list[DenseParam] = []
    if with_dense:
        # TP split as in Megatron's MLA: up-projections column-parallel, o_proj row-parallel,
        # down-projections, norms and the router replicated.
        dense.append(DenseParam("embed_tokens", (vocab, hidden), 0, layer=-1))
        for i in range(n):
            p = f"layers.{i}."
            dense += [
                DenseParam(p + "input_layernorm", (hidden,), layer=i),
                DenseParam(p + "self_attn.q_a_proj", (q_lora, hidden), layer=i),
                DenseParam(p + "self_attn.q_a_layernorm", (q_lora,), layer=i),
                DenseParam(p + "self_attn.q_b_proj", (heads * (nope + rope), q_lora), 0, layer=i),
                DenseParam(p + "self_attn.kv_a_proj_with_mqa", (kv_lora + rope, hidden), layer=i),
                DenseParam(p + "self_attn.kv_a_layernorm", (kv_lora,), layer=i),
                DenseParam(p + "self_attn.kv_b_proj", (heads * (nope + v_dim), kv_lora), 0, layer=i),
                DenseParam(p + "self_attn.o_proj", (hidden, heads * v_dim), 1, layer=i),
                DenseParam(p + "post_attention_layernorm", (hidden,), layer=i),
            ]
            if i < first_moe:
                dense += [
                    DenseParam(p + "mlp.gate_up_proj", (2 * dense_ffn, hidden), 0, layer=i),
                    DenseParam(p + "mlp.down_proj", (hidden, dense_ffn), 1, layer=i),
                ]
            else:
                dense += [
                    DenseParam(p + "mlp.gate", (256, hidden), layer=i),
                    DenseParam(p + "mlp.gate.e_score_correction_bias", (256,), dtype="float32", layer=i),
                    DenseParam(p + "mlp.shared_experts.gate_up_proj", (2 * moe_ffn, hidden), 0, layer=i),
                    DenseParam(p + "mlp.shared_experts.down_proj", (hidden, moe_ffn), 1, layer=i),
                ]
        dense.append(DenseParam("norm", (hidden,), layer=n))
        dense.append(DenseParam("lm_head", (vocab, hidden), 0, layer=n))
    return ModelSpec(n, tuple(range(first_moe, n)), 256, experts, tuple(dense))


# ----------------------------------------------------------------------------- accounting


@dataclass
class Traffic:
    """Per-rank figures of one kind of collective step, summed over its calls."""

    calls: int = 0
    sent: int = 0
    recv: int = 0
    buffer: int = 0
    peak_extra: int = 0

    def add(self, *, sent: int, recv: int, buffer: int, extra: int = 0) -> None:
        self.calls += 1
        self.sent += sent
        self.recv += recv
        self.buffer += buffer
        self.peak_extra = max(self.peak_extra, extra)


Meter = dict[str, Traffic]


def _record(meter: Meter | None, step: str, **kw: int) -> None:
    if meter is not None:
        meter.setdefault(step, Traffic()).add(**kw)


def totals(meter: Meter, prefix: str = "") -> Traffic:
    """Sum of every step whose name starts with `prefix` (peak_extra is the max)."""
    out = Traffic()
    for step, t in meter.items():
        if step.startswith(prefix):
            out.calls += t.calls
            out.sent += t.sent
            out.recv += t.recv
            out.buffer += t.buffer
            out.peak_extra = max(out.peak_extra, t.peak_extra)
    return out


# ----------------------------------------------------------------------------- expert planner


@dataclass(frozen=True)
class Route:
    """Experts of one MoE layer that training rank `src` gives rollout rank `dst` (dst's order)."""

    src: int
    dst: int
    experts: tuple[int, ...]


@dataclass(frozen=True)
class ExpertPlan:
    """Who sends which expert to whom, for the MoE layers of each training PP stage."""

    method: str  # ALLTOALLV, or ALLGATHER when the divisibility condition fails
    reason: str
    train: TrainLayout
    rollout: RolloutLayout
    num_experts: int
    routes: tuple[tuple[Route, ...], ...]  # per stage; empty when method is ALLGATHER

    @cached_property
    def _index(self) -> tuple[dict[tuple[int, int], list[Route]], dict[tuple[int, int], list[Route]]]:
        by_src: dict[tuple[int, int], list[Route]] = {}
        by_dst: dict[tuple[int, int], list[Route]] = {}
        for stage, routes in enumerate(self.routes):
            for r in routes:
                by_src.setdefault((stage, r.src), []).append(r)
                by_dst.setdefault((stage, r.dst), []).append(r)
        return by_src, by_dst

    @cached_property
    def _moves_by_index(self) -> tuple[tuple[tuple[Move, ...], ...], ...]:
        """Per stage, per local expert index: the moves of the experts at that index (see tensor_moves)."""
        per = self.num_experts // self.train.ep
        out = []
        for routes in self.routes:
            by_index: list[list[Move]] = [[] for _ in range(per)]
            for r in routes:
                pos = {x: i for i, x in enumerate(self.train.experts_held(r.src, self.num_experts))}
                for x in r.experts:
                    by_index[pos[x]].append(Move(r.src, r.dst, x))
            out.append(tuple(tuple(sorted(ms, key=lambda m: (m.dst, m.src))) for ms in by_index))
        return tuple(out)

    def sends(self, rank: int, stage: int) -> tuple[Route, ...]:
        """Routes out of `rank` (self included), by destination rank."""
        return tuple(sorted(self._index[0].get((stage, rank), ()), key=lambda r: r.dst))

    def recvs(self, rank: int, stage: int) -> tuple[Route, ...]:
        """Routes into `rank` (self included), by source rank."""
        return tuple(sorted(self._index[1].get((stage, rank), ()), key=lambda r: r.src))

    def send_slice(self, rank: int, stage: int) -> tuple[int, int] | None:
        """(start, stop) when the sends are one contiguous slice of the local experts in order, else None."""
        held = self.train.experts_held(rank, self.num_experts)
        pos = {x: i for i, x in enumerate(held)}
        order = [pos[x] for r in self.sends(rank, stage) for x in r.experts]
        if not order:
            return (0, 0)
        return (order[0], order[-1] + 1) if order == list(range(order[0], order[-1] + 1)) else None

    def recv_in_order(self, rank: int, stage: int) -> bool:
        """True when the AlltoAllV output (by source rank) is already in the rollout's expert order."""
        got = [x for r in self.recvs(rank, stage) for x in r.experts]
        return got == list(self.rollout.experts_needed(rank, self.num_experts))

    def table(self, rank: int, expert_nbytes: int) -> list[dict[str, Any]]:
        """Send and receive rows of `rank` for one (layer, parameter) per stage, with byte counts."""
        rows = []
        for stage in range(len(self.routes)):
            for r in self.sends(rank, stage):
                rows.append(
                    {
                        "stage": stage,
                        "dir": "send",
                        "peer": r.dst,
                        "experts": r.experts,
                        "nbytes": len(r.experts) * expert_nbytes,
                        "self": r.dst == rank,
                    }
                )
            for r in self.recvs(rank, stage):
                rows.append(
                    {
                        "stage": stage,
                        "dir": "recv",
                        "peer": r.src,
                        "experts": r.experts,
                        "nbytes": len(r.experts) * expert_nbytes,
                        "self": r.src == rank,
                    }
                )
        return rows


def plan_experts(train: TrainLayout, rollout: RolloutLayout, num_experts: int) -> ExpertPlan:
    """Route every expert from one holder to each rollout rank that needs it; fall back when EPs don't divide."""
    train.check(num_experts)
    rollout.check(num_experts)
    if train.world_size != rollout.world_size:
        raise ValueError(
            f"colocated reshard needs equal worlds, got train {train.world_size} rollout {rollout.world_size}"
        )
    if train.ep % rollout.ep and rollout.ep % train.ep:
        reason = f"neither training EP {train.ep} nor rollout EP {rollout.ep} divides the other"
        log.warning("moe_reshard: %s; routed experts fall back to the all-gather baseline", reason)
        return ExpertPlan(ALLGATHER, reason, train, rollout, num_experts, ())
    routes = tuple(_stage_routes(train, rollout, num_experts, s) for s in range(train.pp))
    return ExpertPlan(ALLTOALLV, "EP sizes divide", train, rollout, num_experts, routes)


def _stage_routes(
    train: TrainLayout, rollout: RolloutLayout, num_experts: int, stage: int
) -> tuple[Route, ...]:
    holders: dict[int, list[int]] = {}
    for rank in train.stage_ranks(stage):
        for x in train.experts_held(rank, num_experts):
            holders.setdefault(x, []).append(rank)
    src_of: dict[tuple[int, int], int] = {}
    pending: dict[int, list[tuple[int, int]]] = {}  # EP rank -> (dst, expert) still without a sender
    for dst in range(rollout.world_size):
        for x in rollout.experts_needed(dst, num_experts):
            if dst in holders[x]:
                src_of[(dst, x)] = dst  # the card already holds it: a local copy, no traffic
            else:
                pending.setdefault(train.ep_rank(holders[x][0]), []).append((dst, x))
    for pairs in pending.values():
        replicas = holders[pairs[0][1]]
        # contiguous chunks keep each replica's sends one slice of its local experts (no pack copy)
        start = 0
        for replica, count in zip(replicas, _split_counts(len(pairs), len(replicas)), strict=True):
            for pair in pairs[start : start + count]:
                src_of[pair] = replica
            start += count
    grouped: dict[tuple[int, int], list[int]] = {}
    for dst in range(rollout.world_size):
        for x in rollout.experts_needed(dst, num_experts):
            grouped.setdefault((src_of[(dst, x)], dst), []).append(x)
    return tuple(Route(src, dst, tuple(xs)) for (src, dst), xs in sorted(grouped.items()))


# ----------------------------------------------------------------------------- expert cost model


def expert_step_traffic(plan: ExpertPlan, rank: int, stage: int, expert_nbytes: int) -> dict[str, int]:
    """sent/recv/buffer/extra of `rank` for ONE (layer, parameter) of `stage` under the plan."""
    sends, recvs = plan.sends(rank, stage), plan.recvs(rank, stage)
    sent = sum(len(r.experts) for r in sends if r.dst != rank) * expert_nbytes
    recv = sum(len(r.experts) for r in recvs if r.src != rank) * expert_nbytes
    out = sum(len(r.experts) for r in recvs) * expert_nbytes
    pack = (
        0 if plan.send_slice(rank, stage) is not None else sum(len(r.experts) for r in sends) * expert_nbytes
    )
    final = 0 if plan.recv_in_order(rank, stage) else out
    return {"sent": sent, "recv": recv, "buffer": out, "extra": pack + out + final}


def baseline_step_traffic(
    train: TrainLayout, num_experts: int, rank: int, stage: int, expert_nbytes: int
) -> list[tuple[str, dict[str, int]]]:
    """The baseline's collectives for ONE (layer, parameter) of `stage`: PP broadcast, then EP all-gather."""
    local = num_experts // train.ep * expert_nbytes
    full = num_experts * expert_nbytes
    steps: list[tuple[str, dict[str, int]]] = []
    if train.pp > 1:
        root = train.stage(rank) == stage
        steps.append(
            (
                "experts/pp_broadcast",
                {
                    "sent": (train.pp - 1) * local if root else 0,
                    "recv": 0 if root else local,
                    "buffer": local,
                    "extra": full,
                },
            )
        )
    if train.ep > 1:
        g = (train.ep - 1) * local
        steps.append(("experts/ep_allgather", {"sent": g, "recv": g, "buffer": full, "extra": full}))
    return steps


def expert_traffic(plan: ExpertPlan, model: ModelSpec, rank: int, *, baseline: bool = False) -> Meter:
    """Per-rank figures for one whole update (every MoE layer, every expert parameter)."""
    meter: Meter = {}
    use_baseline = baseline or plan.method == ALLGATHER
    cache: dict[tuple[int, int], list[tuple[str, dict[str, int]]]] = {}
    for layer in model.moe_layers:
        stage = plan.train.stage_of_layer(layer, model.num_layers)
        for param in model.expert_params:
            key = (stage, param.nbytes)
            if key not in cache:
                if use_baseline:
                    cache[key] = baseline_step_traffic(
                        plan.train, plan.num_experts, rank, stage, param.nbytes
                    )
                else:
                    cache[key] = [("experts/alltoallv", expert_step_traffic(plan, rank, stage, param.nbytes))]
            for step, kw in cache[key]:
                _record(meter, step, **kw)
    return meter


# ----------------------------------------------------------------------------- dense planner and cost


@dataclass(frozen=True, eq=False)
class DensePlan:
    """Order of the dense exchange: rounds of equal-sized parameters, one per PP stage, then leftovers."""

    train: TrainLayout
    params: tuple[DenseParam, ...]
    num_layers: int
    stage_of: dict[str, int]
    rounds: tuple[tuple[str, ...], ...]  # one name per stage, all the same numel and dtype
    leftovers: tuple[str, ...]  # broadcast from their stage after its TP all-gather

    def param(self, name: str) -> DenseParam:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, DenseParam]:
        return {p.name: p for p in self.params}


def plan_dense(train: TrainLayout, params: Sequence[DenseParam], num_layers: int) -> DensePlan:
    """Pair each stage's parameters with equal-sized ones of every other stage; the rest are leftovers."""
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise ValueError("dense parameter names must be unique")
    for p in params:
        p.shard_shape(train.tp)
    stage_of = {p.name: train.stage_of_layer(p.layer, num_layers) for p in params}
    queues: list[dict[tuple[int, str], list[str]]] = [{} for _ in range(train.pp)]
    keys: list[tuple[int, str]] = []
    for p in params:
        key = (_numel(p.shape), p.dtype)
        if key not in keys:
            keys.append(key)
        queues[stage_of[p.name]].setdefault(key, []).append(p.name)
    rounds: list[tuple[str, ...]] = []
    paired: set[str] = set()
    if train.pp > 1:
        for key in keys:
            count = min(len(q.get(key, [])) for q in queues)
            for i in range(count):
                rounds.append(tuple(q[key][i] for q in queues))
                paired.update(rounds[-1])
    leftovers = tuple(n for n in names if n not in paired)
    return DensePlan(train, tuple(params), num_layers, stage_of, tuple(rounds), leftovers)


def _dense_baseline_steps(plan: DensePlan, rank: int) -> list[tuple[str, DenseParam, dict[str, int]]]:
    t, p = plan.train.tp, plan.train.pp
    steps = []
    for prm in plan.params:
        shard = _numel(prm.shard_shape(t)) * DTYPE_BYTES[prm.dtype]
        if p > 1:
            root = plan.train.stage(rank) == plan.stage_of[prm.name]
            steps.append(
                (
                    "dense/pp_broadcast",
                    prm,
                    {"sent": (p - 1) * shard if root else 0, "recv": 0 if root else shard, "buffer": shard},
                )
            )
        if prm.tp_dim is not None and t > 1:
            steps.append(
                (
                    "dense/tp_allgather",
                    prm,
                    {"sent": (t - 1) * shard, "recv": (t - 1) * shard, "buffer": prm.nbytes},
                )
            )
    return steps


def _tp_gather_step(plan: DensePlan, prm: DenseParam) -> dict[str, int] | None:
    t = plan.train.tp
    if prm.tp_dim is None or t == 1:
        return None
    shard = _numel(prm.shard_shape(t)) * DTYPE_BYTES[prm.dtype]
    return {"sent": (t - 1) * shard, "recv": (t - 1) * shard, "buffer": prm.nbytes}


def dense_traffic(plan: DensePlan, rank: int, *, baseline: bool = False) -> Meter:
    """Per-rank figures for the dense parameters of one update, baseline or TP-then-PP order."""
    meter: Meter = {}
    if baseline:
        for step, _, kw in _dense_baseline_steps(plan, rank):
            _record(meter, step, **kw)
        return meter
    p, my_stage = plan.train.pp, plan.train.stage(rank)
    for names in plan.rounds:
        mine = plan.param(names[my_stage])
        if (kw := _tp_gather_step(plan, mine)) is not None:
            _record(meter, "dense/tp_allgather", **kw)
        _record(
            meter,
            "dense/pp_alltoall",
            sent=(p - 1) * mine.nbytes,
            recv=sum(plan.param(n).nbytes for s, n in enumerate(names) if s != my_stage),
            buffer=sum(plan.param(n).nbytes for n in names),
        )
    for name in plan.leftovers:
        prm, root = plan.param(name), plan.stage_of[name] == my_stage
        if root and (kw := _tp_gather_step(plan, prm)) is not None:
            _record(meter, "dense/tp_allgather", **kw)
        if p > 1:
            _record(
                meter,
                "dense/pp_broadcast",
                sent=(p - 1) * prm.nbytes if root else 0,
                recv=0 if root else prm.nbytes,
                buffer=prm.nbytes,
            )
    return meter


# ----------------------------------------------------------------------------- executor (torch)


@dataclass
class Groups:
    """This rank's TP, PP and EP process groups of the training layout (None when of size 1)."""

    tp: Any = None
    pp: Any = None
    ep: Any = None
    tp_ranks: tuple[int, ...] = ()
    pp_ranks: tuple[int, ...] = ()
    ep_ranks: tuple[int, ...] = ()


def build_groups(train: TrainLayout) -> Groups:
    """Create the TP, PP and EP groups (every rank must call this, in the same order)."""
    import torch.distributed as dist

    rank, out = dist.get_rank(), Groups()
    for kind, groups in (("tp", train.tp_groups()), ("pp", train.pp_groups()), ("ep", train.ep_groups())):
        for ranks in groups:
            group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                setattr(out, kind, group)
                setattr(out, kind + "_ranks", ranks)
    return out


def _dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


def reshard_experts(
    plan: ExpertPlan,
    stage: int,
    local: torch.Tensor | None,
    param: ExpertParam,
    *,
    groups: Groups | None = None,
    meter: Meter | None = None,
    baseline: bool = False,
) -> torch.Tensor:
    """One expert parameter of one MoE layer owned by `stage`; returns [experts needed, *param.shape].

    `local` is [experts held, *param.shape] on the ranks of `stage` (None elsewhere). Every rank of
    the world calls this for every (layer, parameter) in the same order.
    """
    if baseline or plan.method == ALLGATHER:
        if groups is None:
            raise ValueError("the all-gather baseline needs build_groups(train)")
        return allgather_experts(
            plan.train, plan.rollout, plan.num_experts, stage, local, param, groups=groups, meter=meter
        )
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    world = plan.train.world_size
    sends, recvs = plan.sends(rank, stage), plan.recvs(rank, stage)
    dtype, numel = _dtype(param.dtype), _numel(param.shape)
    extra = 0
    send_elems = [0] * world
    for r in sends:
        send_elems[r.dst] = len(r.experts) * numel
    if sends:
        if local is None:
            raise ValueError(f"rank {rank} must pass its local experts of stage {stage}")
        span = plan.send_slice(rank, stage)
        if span is not None:
            send = local.reshape(local.shape[0], -1)[span[0] : span[1]].reshape(-1)  # a view, no copy
        else:
            pos = {x: i for i, x in enumerate(plan.train.experts_held(rank, plan.num_experts))}
            idx = torch.tensor([pos[x] for r in sends for x in r.experts], dtype=torch.long)
            send = local.reshape(local.shape[0], -1).index_select(0, idx).reshape(-1)
            extra += send.numel() * send.element_size()
    else:
        send = torch.empty(0, dtype=dtype)
    recv_elems = [0] * world
    for r in recvs:
        recv_elems[r.src] = len(r.experts) * numel
    out = torch.empty(sum(recv_elems), dtype=dtype)
    dist.all_to_all_single(out, send.contiguous(), recv_elems, send_elems)
    esize = out.element_size()
    extra += out.numel() * esize
    needed = plan.rollout.experts_needed(rank, plan.num_experts)
    got = [x for r in recvs for x in r.experts]
    out = out.view(len(got), *param.shape)
    if got != list(needed):
        pos = {x: i for i, x in enumerate(got)}
        out = out.index_select(0, torch.tensor([pos[x] for x in needed], dtype=torch.long))
        extra += out.numel() * esize
    _record(
        meter,
        "experts/alltoallv",
        sent=sum(n for d, n in enumerate(send_elems) if d != rank) * esize,
        recv=sum(n for s, n in enumerate(recv_elems) if s != rank) * esize,
        buffer=sum(recv_elems) * esize,
        extra=extra,
    )
    return out


def allgather_experts(
    train: TrainLayout,
    rollout: RolloutLayout,
    num_experts: int,
    stage: int,
    local: torch.Tensor | None,
    param: ExpertParam,
    *,
    groups: Groups,
    meter: Meter | None = None,
) -> torch.Tensor:
    """Baseline: broadcast the layer's local experts over PP, all-gather them over EP, keep what is needed."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    per = num_experts // train.ep
    buf = torch.empty((num_experts, *param.shape), dtype=_dtype(param.dtype))
    full = buf.numel() * buf.element_size()
    k = train.ep_rank(rank)
    slot = buf[k * per : (k + 1) * per]
    owner = train.stage(rank) == stage
    if owner:
        if local is None:
            raise ValueError(f"rank {rank} must pass its local experts of stage {stage}")
        slot.copy_(local)
    local_bytes = slot.numel() * slot.element_size()
    if train.pp > 1:
        root = train.stage_ranks(stage)[rank % train.stage_size]
        dist.broadcast(slot, src=root, group=groups.pp)
        _record(
            meter,
            "experts/pp_broadcast",
            sent=(train.pp - 1) * local_bytes if owner else 0,
            recv=0 if owner else local_bytes,
            buffer=local_bytes,
            extra=full,
        )
    if train.ep > 1:
        dist.all_gather(list(buf.chunk(train.ep)), slot, group=groups.ep)
        g = (train.ep - 1) * local_bytes
        _record(meter, "experts/ep_allgather", sent=g, recv=g, buffer=full, extra=full)
    order = [x for k2 in range(train.ep) for x in train.experts_held(train.stage_ranks(0)[k2], num_experts)]
    pos = {x: i for i, x in enumerate(order)}
    idx = [pos[x] for x in rollout.experts_needed(rank, num_experts)]
    if idx == list(range(idx[0], idx[-1] + 1)):
        return buf[idx[0] : idx[-1] + 1]
    return buf.index_select(0, torch.tensor(idx, dtype=torch.long))


def shard_dense(train: TrainLayout, prm: DenseParam, full: torch.Tensor, rank: int) -> torch.Tensor:
    """The TP shard of a full dense tensor that training rank `rank` holds."""
    if prm.tp_dim is None or train.tp == 1:
        return full.clone()
    return full.chunk(train.tp, dim=prm.tp_dim)[train.tp_rank(rank)].clone()


def reshard_dense(
    plan: DensePlan,
    local: dict[str, torch.Tensor],
    *,
    groups: Groups,
    meter: Meter | None = None,
    baseline: bool = False,
) -> dict[str, torch.Tensor]:
    """Full dense parameters on every rank from the TP shards of each rank's own stage."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    train = plan.train
    t, p, my_stage = train.tp, train.pp, train.stage(rank)

    def tp_gather(prm: DenseParam, shard: torch.Tensor) -> torch.Tensor:
        if prm.tp_dim is None or t == 1:
            return shard
        parts = [torch.empty_like(shard) for _ in range(t)]
        dist.all_gather(parts, shard.contiguous(), group=groups.tp)
        b = shard.numel() * shard.element_size()
        _record(meter, "dense/tp_allgather", sent=(t - 1) * b, recv=(t - 1) * b, buffer=t * b)
        return torch.cat(parts, dim=prm.tp_dim)

    def pp_broadcast(prm: DenseParam, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        root = plan.stage_of[prm.name] == my_stage
        buf = tensor.contiguous() if root else torch.empty(shape, dtype=_dtype(prm.dtype))
        src = train.stage_ranks(plan.stage_of[prm.name])[rank % train.stage_size]
        dist.broadcast(buf, src=src, group=groups.pp)
        b = buf.numel() * buf.element_size()
        _record(meter, "dense/pp_broadcast", sent=(p - 1) * b if root else 0, recv=0 if root else b, buffer=b)
        return buf

    out: dict[str, torch.Tensor] = {}
    if baseline:
        for prm in plan.params:
            shard = local.get(prm.name)
            if p > 1:
                shard = pp_broadcast(prm, shard, prm.shard_shape(t))
            out[prm.name] = tp_gather(prm, shard)
        return out
    for names in plan.rounds:
        mine = plan.param(names[my_stage])
        full = tp_gather(mine, local[mine.name]).contiguous()
        buf = torch.empty((p, full.numel()), dtype=full.dtype)
        dist.all_gather(list(buf.unbind(0)), full.reshape(-1), group=groups.pp)
        b = full.numel() * full.element_size()
        _record(meter, "dense/pp_alltoall", sent=(p - 1) * b, recv=(p - 1) * b, buffer=p * b)
        for s, name in enumerate(names):
            out[name] = buf[s].view(plan.param(name).shape)
    for name in plan.leftovers:
        prm = plan.param(name)
        full = tp_gather(prm, local[name]) if plan.stage_of[name] == my_stage else None
        out[name] = pp_broadcast(prm, full, prm.shape) if p > 1 else full
    return out


# ----------------------------------------------------------------------------- per-tensor streaming
#
# A weight sync that streams one parameter at a time (verl's Megatron ``per_tensor_generator``) sees
# one local expert tensor per (layer, parameter, local expert id): every holder of the owning stage
# has the expert at that index of its local experts. The moves below are the plan's routes cut to
# that index; summed over the local ids they are exactly the plan's (layer, parameter) figures.


@dataclass(frozen=True)
class Move:
    """Training rank `src` gives rollout rank `dst` global expert `expert` (src == dst: a local copy)."""

    src: int
    dst: int
    expert: int


def tensor_moves(plan: ExpertPlan, stage: int, local_expert_id: int) -> tuple[Move, ...]:
    """The plan's moves of the experts at local index `local_expert_id` of their holders in `stage`."""
    if plan.method != ALLTOALLV:
        raise ValueError(f"the plan falls back to the all-gather ({plan.reason}); it has no moves")
    per = plan.num_experts // plan.train.ep
    if not 0 <= local_expert_id < per:
        raise ValueError(
            f"local expert id {local_expert_id} is outside the {per} experts of a training EP rank"
        )
    return plan._moves_by_index[stage][local_expert_id]


def tensor_step_traffic(
    plan: ExpertPlan, rank: int, stage: int, local_expert_id: int, expert_nbytes: int
) -> dict[str, int]:
    """sent/recv/buffer/extra of `rank` for ONE local expert tensor; sent/recv/buffer sum to the plan's step."""
    moves = tensor_moves(plan, stage, local_expert_id)
    if all(m.src == m.dst for m in moves):  # local copies only: no collective, no buffer
        return {"sent": 0, "recv": 0, "buffer": 0, "extra": 0}
    out = [m for m in moves if m.dst == rank]
    remote_dsts = [m.dst for m in moves if m.src == rank and m.dst != rank]
    sent = len(remote_dsts) * expert_nbytes
    recv = sum(1 for m in out if m.src != rank) * expert_nbytes
    buffer = len(out) * expert_nbytes
    # the tensor goes out as a view when it has at most one destination, else packed once per destination
    sends = sum(1 for m in moves if m.src == rank)
    pack = sends * expert_nbytes if sends > 1 else 0
    return {"sent": sent, "recv": recv, "buffer": buffer, "extra": pack + buffer}


def route_expert_tensor(
    plan: ExpertPlan,
    stage: int,
    local_expert_id: int,
    tensor: torch.Tensor | None,
    *,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: Any = None,
    group: Any = None,
    meter: Meter | None = None,
) -> list[tuple[int, torch.Tensor]]:
    """One local expert tensor of `stage` to the rollout ranks that keep it; returns [(global expert id, tensor)].

    `tensor` is this rank's expert at `local_expert_id` on the ranks of `stage` (None elsewhere); `shape` and
    `dtype` are that tensor's. Every rank of `group` (rank i of the group = layout rank i) calls this for every
    (layer, parameter, local expert id) in the same order. The result holds the experts with that local id that
    this rank's rollout engine keeps, by ascending global id: exactly the ones the all-gather would have given
    it among all experts. No collective is issued when every move is a local copy.
    """
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world != plan.train.world_size:
        raise ValueError(f"the group has {world} ranks, the plan {plan.train.world_size}")
    moves = tensor_moves(plan, stage, local_expert_id)
    mine = [m for m in moves if m.src == rank]
    if mine and tensor is None:
        raise ValueError(f"rank {rank} holds experts of stage {stage} and must pass its local tensor")
    if device is None:
        device = tensor.device if tensor is not None else "cpu"
    numel = _numel(shape)
    incoming = sorted((m for m in moves if m.dst == rank), key=lambda m: m.src)
    esize = torch.empty((), dtype=dtype).element_size()
    extra = 0
    if all(m.src == m.dst for m in moves):
        got = {m.expert: tensor.detach() for m in incoming}
    else:
        send_elems, recv_elems = [0] * world, [0] * world
        for m in mine:
            send_elems[m.dst] = numel
        for m in incoming:
            recv_elems[m.src] = numel
        flat = tensor.detach().reshape(-1) if mine else None
        if len(mine) > 1:
            send = torch.cat([flat] * len(mine))  # one copy per destination, in destination order
            extra += send.numel() * esize
        elif mine:
            send = flat.contiguous()
        else:
            send = torch.empty(0, dtype=dtype, device=device)
        out = torch.empty(sum(recv_elems), dtype=dtype, device=device)
        dist.all_to_all_single(out, send, recv_elems, send_elems, group=group)
        extra += out.numel() * esize
        got = {m.expert: out[i * numel : (i + 1) * numel].view(*shape) for i, m in enumerate(incoming)}
        _record(
            meter,
            "experts/alltoallv",
            sent=sum(n for d, n in enumerate(send_elems) if d != rank) * esize,
            recv=sum(n for s, n in enumerate(recv_elems) if s != rank) * esize,
            buffer=out.numel() * esize,
            extra=extra,
        )
    return [(x, got[x]) for x in sorted(got)]
