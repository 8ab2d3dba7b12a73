"""The skip's proof on verl 0.9.1's engine workers: the update's own rollout and stale gaps, and a forward count.

Installed into a verl 0.9.1 tree as verl/utils/debug/recipes_update_gap.py by the CPU overlay (cpu-0015), for make
e2e's v091 runs only. With actor.recompute_old_log_prob=False (shared-0016/0017) the trainer runs no actor forward
before the update, so verl logs no training/rollout_probs_diff_* and cpu-0004 has no actor log-probs for its stale
gap: the weight sync's yardstick is gone. The update's own forward runs on the weights the rollout was synced with
(one mini-batch, one epoch: ActorConfig refuses the skip otherwise), so its log_prob stands in for that pass:

- gap_metrics: |p - p_actor| and |log p - log p_actor| over the response tokens, against the rollout's log-probs
  (vLLM's own samples, rollout.calculate_log_probs=True: actor/rollout_*) and the reference's (the initial
  weights: actor/stale_*), the keys make e2e reads for the DeepSeek runs (ascend_rl/harness/launch.py DS_GAP_KEYS);
- ForwardCount: the actor's passes over its weights since the last update reported them (the old-log-prob pass
  included), logged as actor/forward_passes: 1 per step with the skip and one mini-batch, 2 without it.
"""

from __future__ import annotations

import torch

FORWARD_KEY = "actor/forward_passes"


def gap_metrics(log_prob, rollout_log_probs, ref_log_prob, response_mask) -> dict[str, float]:
    """The update pass's gaps to the rollout's and the reference's log-probs (either may be None: left out)."""
    mask = response_mask.bool()
    log_prob = log_prob.detach().float()
    out = {}
    for name, other in (("rollout", rollout_log_probs), ("stale", ref_log_prob)):
        if other is None:
            continue
        other = other.detach().float()
        probs = torch.masked_select((torch.exp(other) - torch.exp(log_prob)).abs(), mask)
        logs = torch.masked_select((other - log_prob).abs(), mask)
        out[f"actor/{name}_probs_diff_mean"] = torch.mean(probs).item()
        out[f"actor/{name}_log_probs_diff_mean"] = torch.mean(logs).item()
    return out


class ForwardCount:
    """Counts an engine's forward passes (an infer_batch or a train_batch call: one per mini-batch, its
    micro-batches all run on the same weights) until `report` hands the count over and starts again."""

    def __init__(self) -> None:
        self.passes = 0

    def add(self) -> None:
        self.passes += 1

    def report(self) -> dict[str, list[int]]:
        out, self.passes = {FORWARD_KEY: [self.passes]}, 0
        return out
