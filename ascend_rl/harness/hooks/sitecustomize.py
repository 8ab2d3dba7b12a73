"""Test-only hooks: the weight-sync negative control, and a pause inside a checkpoint save for the fault tests.

With RECIPES_E2E_DISABLE_WEIGHT_SYNC=1, verl's vLLM rollouts keep the initial weights.

vLLM is built with dummy weights and the first sync loads the initial policy; every later sync is
skipped, so the rollout samples from the initial weights while the actor trains. verl 0.6.0 syncs in
vllm_rollout_spmd (vLLMRollout, vLLMAsyncRollout), verl 0.7.1 in vllm_rollout (ServerAdapter, which sends
the weights to the vLLM server's engine); the hook patches whichever of them the tree has.

ascend_rl/harness/launch.py puts this folder on PYTHONPATH for every harness launch (the /dev/shm record is always
on); each hook acts only when its variable is set. `--disable-weight-sync` is the negative control of the weight-sync
check: with the sync gone, training/rollout_probs_diff_mean must grow to the stale level. The other hooks
(rank_evidence, recipes_memory_record, and the launchers' recipes_shm_record from ascend_rl/shm_record/, which launch()
puts on PYTHONPATH beside this folder) are imported at the end; recipes_hook_util is what they share.
Python imports sitecustomize at start-up in every process (the driver, Ray's workers, vLLM's engine),
so the rollout classes are patched wherever they are loaded. It never ships in a recipe.

With RECIPES_FAULT_PAUSE_SAVE=<text> and RECIPES_FAULT_MARKER=<path>, the first torch.save to a path
containing <text> (e.g. "global_step_2.partial/actor": a trainer rank writing its shard of step 2) writes
<path>.<pid> ("<pid> <file>") and blocks there: tests/harness/test_faults.py kills the run, or one process
of it, at that moment, which is then a real point inside a save rather than a race against it.
"""

import os
import sys
import time

from recipes_hook_util import install

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


def _pause_in_save(save):
    where, marker = os.environ["RECIPES_FAULT_PAUSE_SAVE"], os.environ["RECIPES_FAULT_MARKER"]

    def wrapper(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and where in os.fspath(f):
            with open(f"{marker}.{os.getpid()}", "w") as out:
                out.write(f"{os.getpid()} {os.fspath(f)}\n")
            while True:  # until the test kills this process
                time.sleep(60)
        return save(obj, f, *args, **kwargs)

    return wrapper


def _disable_sync(module):
    for name in _TARGETS[module.__name__]:
        cls = getattr(module, name, None)
        if cls is not None:
            cls.update_weights = _first_sync_only(cls.update_weights)
    print(f"[e2e] weight sync disabled in {module.__name__} (pid {os.getpid()})", file=sys.stderr)


def _pause_torch_save(module):
    module.save = _pause_in_save(module.save)


if os.environ.get("RECIPES_E2E_DISABLE_WEIGHT_SYNC") == "1":
    install(dict.fromkeys(_TARGETS, _disable_sync))
if os.environ.get("RECIPES_FAULT_PAUSE_SAVE") and os.environ.get("RECIPES_FAULT_MARKER"):
    install({"torch": _pause_torch_save})
import rank_evidence  # noqa: E402,F401  (RECIPES_RANK_EVIDENCE: where each rank runs, hooks/rank_evidence.py)
import recipes_memory_record  # noqa: E402,F401  (RECIPES_MEMORY_RECORD: bytes per rank and phase, hooks/recipes_memory_record.py)
import recipes_shm_record  # noqa: E402,F401  (RECIPES_SHM_RECORD: the run's /dev/shm names, shm_record/recipes_shm_record.py)
