"""Test-only: with RECIPES_E2E_DISABLE_WEIGHT_SYNC=1, verl's vLLM rollouts keep the initial weights.

vLLM is built with dummy weights and the first sync loads the initial policy; every later sync is
skipped, so the rollout samples from the initial weights while the actor trains. verl 0.6.0 syncs in
vllm_rollout_spmd (vLLMRollout, vLLMAsyncRollout), verl 0.7.1 in vllm_rollout (ServerAdapter, which sends
the weights to the vLLM server's engine); the hook patches whichever of them the tree has.

ascend_rl/harness/launch.py puts this folder on PYTHONPATH only for e2e's `--disable-weight-sync`, the negative
control of the weight-sync check: with the sync gone, training/rollout_probs_diff_mean must grow to the stale level.
Python imports sitecustomize at start-up in every process (the driver, Ray's workers, vLLM's engine),
so the rollout classes are patched wherever they are loaded. It never ships in a recipe.
"""

import importlib.abc
import importlib.util
import os
import sys

# module -> the rollout classes in it whose update_weights(weights, **kwargs) loads the actor's weights
_TARGETS = {
    "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd": ("vLLMRollout", "vLLMAsyncRollout"),  # verl 0.6.0
    "verl.workers.rollout.vllm_rollout.vllm_rollout": ("ServerAdapter",),  # verl 0.7.1
}


def _first_sync_only(update_weights):
    """The engine starts from dummy weights: let the first sync load the initial policy, skip the rest."""
    done = set()

    async def wrapper(self, weights, **kwargs):
        if id(self) not in done:
            done.add(id(self))
            return await update_weights(self, weights, **kwargs)
        for _name, _tensor in weights:  # drain the generator so the trainer's side runs as usual
            pass

    return wrapper


class _PatchAfterLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Patching(spec.loader)
        return spec


class _Patching(importlib.abc.Loader):
    """Loads a target module with its own loader, then wraps its rollouts' update_weights."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for name in _TARGETS[module.__name__]:
            cls = getattr(module, name, None)
            if cls is not None:
                cls.update_weights = _first_sync_only(cls.update_weights)
        print(f"[e2e] weight sync disabled in {module.__name__} (pid {os.getpid()})", file=sys.stderr)


if os.environ.get("RECIPES_E2E_DISABLE_WEIGHT_SYNC") == "1":
    sys.meta_path.insert(0, _PatchAfterLoad())
