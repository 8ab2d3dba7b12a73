"""Recompute vs. skip of the old-log-prob pass: same update, one actor forward pass fewer per step."""

from __future__ import annotations

# Metrics of the update itself; on-policy both runs must agree on every one of them.
UPDATE_KEYS = (
    "actor/loss",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "reward/mean",
    "advantage/abs_mean",
)
TOLERANCE = 1e-6


def max_weight_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two state dicts of the same model."""
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def summarise(recompute: list[dict], skip: list[dict], weight_diff: float) -> dict:
    """Per-metric largest difference over steps, forward passes per step of each run, and the verdict."""
    diffs = {k: max(abs(r[k] - s[k]) for r, s in zip(recompute, skip, strict=True)) for k in UPDATE_KEYS}
    fwd_on = [r["actor/forward_passes"] for r in recompute]
    fwd_off = [s["actor/forward_passes"] for s in skip]
    return {
        "steps": len(recompute),
        "max_abs_diff": diffs,
        "final_weights_max_abs_diff": weight_diff,
        "forward_passes_per_step": {"recompute": fwd_on, "skip": fwd_off},
        "old_log_prob_seconds": {
            "recompute": sum(r["timing/old_log_prob"] for r in recompute),
            "skip": sum(s["timing/old_log_prob"] for s in skip),
        },
        # Only groups with mixed rewards give GRPO a non-zero advantage: the comparison means something then.
        "groups_reward_varied": [r["groups/reward_varied"] for r in recompute],
        "nonzero_advantage": all(r["advantage/abs_mean"] > 0 for r in recompute),
        "same_update": all(v <= TOLERANCE for v in diffs.values()) and weight_diff <= TOLERANCE,
        "one_pass_fewer": all(a - b == 1 for a, b in zip(fwd_on, fwd_off, strict=True)),
    }


def describe(summary: dict) -> str:
    """A few lines for the terminal."""
    fwd = summary["forward_passes_per_step"]
    secs = summary["old_log_prob_seconds"]
    worst = max(summary["max_abs_diff"].values())
    return "\n".join(
        [
            "recompute_old_log_prob=true vs false, same seed:",
            f"  actor forward passes per step: {fwd['recompute'][0]:g} vs {fwd['skip'][0]:g}"
            f" ({'one fewer' if summary['one_pass_fewer'] else 'NOT one fewer'})",
            f"  prompt groups with mixed rewards (non-zero GRPO advantage) per step: {summary['groups_reward_varied']}"
            f" ({'every step' if summary['nonzero_advantage'] else 'NOT every step'})",
            f"  loss/pg-loss/grad-norm/KL/reward max |diff| over steps {worst:.3g}, final weights max |diff| "
            f"{summary['final_weights_max_abs_diff']:.3g} ({'same update' if summary['same_update'] else 'DIFFERENT'})",
            f"  time in the old-log-prob pass: {secs['recompute']:.2f} s vs {secs['skip']:.2f} s",
        ]
    )
