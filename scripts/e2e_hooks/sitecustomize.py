"""Test-only: with RECIPES_E2E_DISABLE_WEIGHT_SYNC=1, verl's vLLM rollouts never receive the actor's weights.

scripts/e2e.py puts this folder on PYTHONPATH only for `--disable-weight-sync`, the negative control of
the weight-sync check: with the sync gone, training/rollout_probs_diff_mean must grow to the stale level.
Python imports sitecustomize at start-up in every process (the driver, Ray's workers, vLLM's engine),
so the rollout classes are patched wherever they are loaded. It never ships in a recipe.
"""

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"


async def _skip_update_weights(self, weights, **kwargs):
    for _name, _tensor in weights:  # drain the generator so the trainer's side runs as usual
        pass


class _PatchAfterLoad(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for name in ("vLLMRollout", "vLLMAsyncRollout"):
            cls = getattr(module, name, None)
            if cls is not None:
                cls.update_weights = _skip_update_weights
        print(f"[e2e] weight sync disabled in {module.__name__} (pid {os.getpid()})", file=sys.stderr)


if os.environ.get("RECIPES_E2E_DISABLE_WEIGHT_SYNC") == "1":
    sys.meta_path.insert(0, _PatchAfterLoad())
