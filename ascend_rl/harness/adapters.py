"""In-process stand-ins for what verl's Ray workers provide, and a counter of actor forward passes."""

from __future__ import annotations


class ForwardCounter:
    """Counts the rows the actor module runs forward outside generation (log-prob and update passes)."""

    def __init__(self, module) -> None:
        self.rows = 0
        self.enabled = True
        module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, args, kwargs) -> None:
        if self.enabled:
            ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
            self.rows += int(ids.shape[0])


class _GenerateWithoutPositionIds:
    """The actor module as HFRollout sees it: generate() derives position_ids itself, everything else delegates.

    HFRollout passes the prompt's position_ids to generate(); transformers 4.57 does not extend a caller's
    position_ids as tokens are generated, so every new token would get the last prompt position and a
    trained model samples nonsense. Without them, generate() computes the same prompt positions from the
    left-padded attention mask and advances them.
    """

    def __init__(self, module) -> None:
        self._module = module

    def generate(self, *args, **kwargs):
        kwargs.pop("position_ids", None)
        return self._module.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def in_process_hf_rollout(hf_rollout_cls):
    """verl 0.6.0's HFRollout made constructible; its generate_sequences is used unchanged.

    HFRollout predates BaseRollout's current __init__(config, model_config, device_mesh) and its abstract
    resume/update_weights/release, so it cannot be instantiated as shipped. In this process it generates
    with the actor module itself (no memory to free, no weights to sync), position_ids left to generate().
    """

    class InProcessHFRollout(hf_rollout_cls):
        def __init__(self, module, config) -> None:
            # HFRollout.__init__ minus its super().__init__() call, which fails against 0.6.0's BaseRollout.
            self.config = config
            self.module = _GenerateWithoutPositionIds(module)

        async def resume(self, tags: list[str]):
            return None

        async def update_weights(self, weights, **kwargs):
            return None

        async def release(self):
            return None

    return InProcessHFRollout


class InProcessActorGroup:
    """Stands in for the actor worker group: compute_log_prob as the FSDP worker does it, in this process."""

    def __init__(self, actor, meta: dict) -> None:
        self.actor = actor
        self.meta = meta

    def compute_log_prob(self, data):
        from verl import DataProto

        data.meta_info.update(self.meta)
        log_probs, entropys = self.actor.compute_log_prob(data, calculate_entropy=True)
        return DataProto.from_dict(tensors={"old_log_probs": log_probs, "entropys": entropys})
