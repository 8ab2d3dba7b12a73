"""The Megatron training layout a launch hands verl, read from its settings: one source for the pipeline split and the
activation recompute that the memory plan, the dry run and the shape check (ascend_rl/shape_check.py) all use.

megatron-core splits the decoder layers over the pipeline stages in one of three ways (megatron-core 0.16.1,
transformer_config.py; 0.12.1 has the first two only):
- `pipeline_model_parallel_layout`, a string of stages split by `|`: `E` the embedding, `t` a decoder layer, `m` an
  MTP layer, `L` the loss; `x*n` and `(...)*n` repeat, commas are cosmetic (pipeline_parallel_layer_layout.py,
  parse_str_to_list); 0.14 and later;
- `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`: the named end stages take that many,
  the middle stages split the rest evenly or the config is refused (transformer_config.py:1361-1414);
- neither: every stage num_layers / PP, or the model build is refused ("num_layers should be divisible by
  pipeline_model_parallel_size", transformer_block.py:155, from gpt_layer_specs.py:626).
verl passes all three through `actor_rollout_ref.<role>.megatron.override_transformer_config` (0.9.1: onto
Megatron-Bridge's provider, engine/megatron/transformer_impl.py:371-372; 0.6.0 / 0.7.1: into the TransformerConfig
its converter builds, models/mcore/config_converter.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config."
LAYOUT_KEY = OTC + "pipeline_model_parallel_layout"
FIRST_KEY = OTC + "num_layers_in_first_pipeline_stage"
LAST_KEY = OTC + "num_layers_in_last_pipeline_stage"
RECOMPUTE_KEYS = tuple(OTC + k for k in ("recompute_granularity", "recompute_method", "recompute_num_layers"))
PP_KEY = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
# megatron-core's own words for the even split it needs when the launch names none (transformer_block.py:155)
MCORE_EVEN_SPLIT = "num_layers should be divisible by pipeline_model_parallel_size"


class LayoutError(ValueError):
    """A layout megatron-core refuses: `message` in its own words, `fix` the setting that makes it build."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message} ({fix})")
        self.message = message
        self.fix = fix


def parse_layout(text: str) -> list[list[str]]:
    """A pipeline_model_parallel_layout string as its stages' layer letters (megatron-core's grammar)."""
    flat = text.replace(",", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = [list(stage) for stage in flat.split("|")]
    bad = sorted({c for stage in stages for c in stage} - set("ELtm"))
    if bad:
        raise LayoutError(
            f"Invalid layer character: {bad[0]} in pipeline_model_parallel_layout {text!r}",
            "the known layer characters are E, L, t, m",
        )
    return stages


def layout_string(split: tuple[int, ...]) -> str:
    """The layout string of a split: the embedding before the first stage's layers, the loss after the last's."""
    stages = ["t" * n for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def _value(settings: Mapping[str, Any], key: str) -> Any:
    value = settings.get(key)
    return None if value in ("", "null", "None") else value


# the first megatron-core with pipeline_model_parallel_layout (0.12.1's TransformerConfig has no such field)
LAYOUT_STRING_SINCE = (0, 14)


def mcore_version(settings: Mapping[str, Any]) -> tuple[int, int]:
    """(major, minor) of the megatron-core the launch's base pins (its constraints file), (0, 16) if unknown."""
    raw = str(settings.get("_megatron_core") or "0.16")
    major, minor = raw.split(".")[:2]
    return int(major), int(minor)


def pipeline_split(settings: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Decoder layers per PP stage as megatron-core will build them from the launch's settings; LayoutError for a
    split it refuses, with its message and the setting that fixes it. settings["_megatron_core"]: the base's pinned
    megatron-core version (a layout string needs 0.14 or later)."""
    pp = int(settings.get(PP_KEY) or 1)
    layout = _value(settings, LAYOUT_KEY)
    first, last = _value(settings, FIRST_KEY), _value(settings, LAST_KEY)
    has_string = mcore_version(settings) >= LAYOUT_STRING_SINCE
    if layout is not None and not has_string:
        # verl 0.6.0 / 0.7.1's converter drops a key its TransformerConfig lacks with a warning
        # (models/mcore/config_converter.py:137-162, check_and_construct_configs) and megatron-core 0.12.1 has no
        # layout string: the launch would build another split than the one it names (an even one where the layers
        # divide), so the dry run refuses it, in its own words
        raise LayoutError(
            f"megatron-core {'.'.join(map(str, mcore_version(settings)))} has no pipeline_model_parallel_layout: "
            "verl's converter drops it with a warning and builds another split",
            _ends_hint(num_layers, pp),
        )
    if layout is not None:
        stages = parse_layout(str(layout))
        if len(stages) % pp:
            raise LayoutError(
                f"pipeline_model_parallel_layout has {len(stages)} stages, not a multiple of "
                f"pipeline_model_parallel_size {pp}",
                f"write {pp} stages split by '|'",
            )
        if len(stages) != pp:
            raise LayoutError(
                f"pipeline_model_parallel_layout has {len(stages)} stages for PP {pp}: virtual pipeline stages",
                "the plan and the shape check model one stage per PP rank; write one stage per rank",
            )
        flat = [c for stage in stages for c in stage]
        if flat[:1] != ["E"] or flat[-1:] != ["L"] or flat.count("E") != 1 or flat.count("L") != 1:
            raise LayoutError(
                "The first layer must be embedding and the last the loss, each exactly once",
                f"start pipeline_model_parallel_layout with E and end it with L: {layout_string((1,) * pp)!r} "
                "is the form",
            )
        if flat.count("t") != num_layers:
            raise LayoutError(
                f"Number of decoder layers {flat.count('t')}must match num_layers {num_layers}",
                f"pipeline_model_parallel_layout must hold {num_layers} t's",
            )
        return tuple(stage.count("t") for stage in stages)
    if first is not None or last is not None:
        if pp == 1:
            return (num_layers,)
        rest, middle = num_layers, pp
        ends = []
        for name, n in (("first", first), ("last", last)):
            if n is not None:
                if int(n) <= 0:
                    raise LayoutError(
                        f"num_layers_in_{name}_pipeline_stage must be larger than 0", "set it to 1 or more"
                    )
                rest -= int(n)
                middle -= 1
                ends.append(int(n))
        if bool(rest) != bool(middle):
            raise LayoutError(
                f"Mismatch: {rest} middle layers remaining but {middle} middle PP stages available.",
                "make the first and last stage counts leave layers for the middle stages",
            )
        if middle and rest % middle:
            raise LayoutError(
                f"number of layers at middle stage: {rest} must be divisible bythe middle pipeline model "
                f"parallel size {middle}",
                _fix_hint(num_layers, pp, has_string),
            )
        per = rest // middle if middle else 0
        split = [per] * pp
        if first is not None:
            split[0] = int(first)
        if last is not None:
            split[-1] = int(last)
        return tuple(split)
    if num_layers % pp:
        raise LayoutError(MCORE_EVEN_SPLIT, _fix_hint(num_layers, pp, has_string))
    return (num_layers // pp,) * pp


def balanced_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """`num_layers` over `pp` stages as evenly as they go, the extra layers on the middle stages from the last but one
    backwards (the end stages also hold the embedding and the loss): 61 over 8 is the original recipe's
    [7, 7, 8, 8, 8, 8, 8, 7]."""
    base, extra = divmod(num_layers, pp)
    split = [base] * pp
    order = [*range(pp - 2, 0, -1), 0, pp - 1] if pp > 2 else list(range(pp))
    for stage in order[:extra]:
        split[stage] += 1
    return tuple(split)


def _fix_hint(num_layers: int, pp: int, has_string: bool) -> str:
    """The setting that makes `num_layers` split over `pp` stages: the balanced layout string where the base's
    megatron-core has it, else the first / last stage counts."""
    if has_string:
        return f"set {LAYOUT_KEY.rsplit('.', 1)[1]}={layout_string(balanced_split(num_layers, pp))!r}"
    return _ends_hint(num_layers, pp)


def _ends_hint(num_layers: int, pp: int) -> str:
    """The first / last stage counts closest to an even split that leave an even middle (what megatron-core 0.12.1
    can express)."""
    best = None
    for first in range(1, num_layers):
        for last in range(1, num_layers - first):
            rest = num_layers - first - last
            if pp > 2 and rest % (pp - 2) == 0:
                k = rest // (pp - 2)
                key = (max(abs(first - k), abs(last - k)), -first)
                if best is None or key < best[0]:
                    best = (key, first, last)
    if best is None:
        return f"set num_layers_in_first_pipeline_stage so that the rest splits over {pp - 1} stages"
    _, first, last = best
    return f"set num_layers_in_first_pipeline_stage={first} num_layers_in_last_pipeline_stage={last}"


@dataclass(frozen=True)
class Recompute:
    """Megatron's activation recompute: granularity full / selective / None, method block / uniform, layer count."""

    granularity: str | None
    method: str | None
    num_layers: int | None

    def layers_recomputed(self, stage_layers: int) -> int:
        """How many of a stage's decoder layers recompute their activations in the backward (full granularity):
        block: the stage's first num_layers (transformer_block.py, _checkpointed_forward); uniform: every layer,
        in chunks of num_layers."""
        if self.granularity != "full":
            return 0
        if self.method == "block":
            return min(stage_layers, int(self.num_layers or 0))
        return stage_layers


def recompute(settings: Mapping[str, Any]) -> Recompute:
    """The launch's recompute settings; LayoutError where megatron-core's config refuses them (0.16.1
    transformer_config.py:1160-1185)."""
    granularity, method, num = (_value(settings, k) for k in RECOMPUTE_KEYS)
    if granularity is not None and granularity not in ("full", "selective"):
        raise LayoutError(
            f'When using recompute_granuarlity: {granularity} must be "full"or "selective".',
            "set recompute_granularity=full or selective",
        )
    if granularity is not None and method is not None and method not in ("block", "uniform"):
        raise LayoutError(
            f'recompute_method: {method} must be "block" or "uniform".',
            "set recompute_method=block or uniform",
        )
    if granularity == "full":
        if method is None:
            raise LayoutError(
                'Using recompute_granularity: full so recompute_method must be "block" or "uniform"',
                "set recompute_method=block or uniform",
            )
        if num is None:
            raise LayoutError(
                "When using recompute_granularity: full recompute_num_layers must be between 1 and "
                "num_layers_per_pipeline_rank",
                "set recompute_num_layers",
            )
    if granularity == "selective" and num is not None:
        raise LayoutError(
            "When using recompute_granularity: selective recompute_num_layers must be None.",
            "drop recompute_num_layers",
        )
    return Recompute(granularity, method, None if num is None else int(num))
