"""What a person reads: one line per step, metrics.jsonl, a PNG of the curves, wall time and peak memory."""

from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path

# new_math_reward.compute_score_dict's components, as verl's reward manager reports them per response.
COMPONENTS = (("reward/accuracy", "accuracy"), ("reward/format", "format"), ("reward/cot", "cot"))
# (panel title, metric keys) for curves.png; missing keys are skipped.
PANELS = (
    ("reward (mean) and components", ("reward/mean", "reward/accuracy", "reward/format", "reward/cot")),
    ("loss", ("actor/loss", "actor/pg_loss")),
    ("KL to reference (low_var_kl)", ("actor/kl_loss",)),
    ("response length (tokens)", ("response_length/mean",)),
    ("GRPO signal", ("advantage/nonzero_frac", "actor/grad_norm")),
)


def step_line(row: dict) -> str:
    """The per-step line printed under the progress bar."""
    parts = [f"step {row['step']}", f"reward {row['reward/mean']:.3f}"]
    parts += [f"{name} {row[key]:.3f}" for key, name in COMPONENTS if key in row]
    parts += [
        f"varied groups {row['groups/reward_varied']}/{row['groups']}",
        f"loss {row['actor/loss']:+.4g} (pg {row['actor/pg_loss']:+.3g})",
        f"kl {row['actor/kl_loss']:.3g}",
        f"len {row['response_length/mean']:.1f}",
        f"grad {row['actor/grad_norm']:.3g}",
        f"fwd {row['actor/forward_passes']:g}",
        f"scored {row['scored']}/{row['responses']}",
    ]
    return " | ".join(parts)


def eval_line(before: dict, after: dict) -> str:
    """Held-out test accuracy and reward (greedy) before and after the GRPO steps."""
    n = before["problems"]
    return (
        f"test accuracy (greedy, {n} held-out problems, new_math_reward.py): {before['correct']}/{n} -> "
        f"{after['correct']}/{n}, reward mean {before['reward']:.3f} -> {after['reward']:.3f}"
    )


class MetricsFile:
    """metrics.jsonl, one JSON object per step, flushed as each step ends."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, row: dict) -> None:
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_curves(
    rows: list[dict],
    path: Path,
    title: str,
    panels: tuple = PANELS,
    marks: list[tuple[int, str, float, float]] = (),
) -> Path:
    """A small PNG of the panels' metrics over steps (default: reward, loss, KL, response length, GRPO
    signal); marks are (panel index, label, step, value) points drawn on top, e.g. held-out accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.5), dpi=100)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for i, (ax, (panel, keys)) in enumerate(zip(axes.flat, panels, strict=False)):
        for key in keys:
            if any(key in r for r in rows):
                ax.plot(steps, [r.get(key, math.nan) for r in rows], marker="o", ms=3, label=key)
        for _, label, x, y in (m for m in marks if m[0] == i):
            ax.plot([x], [y], marker="*", ms=12, linestyle="none", label=label)
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(6, -10), fontsize=7)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux, bytes on macOS.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def children_rss_mb() -> tuple[int, float]:
    """Number of live child processes (the reward's math_verify workers) and their summed RSS, in MiB."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    total = 0
    for kid in kids:
        try:
            total += kid.memory_info().rss
        except psutil.Error:
            pass
    return len(kids), total / (1024 * 1024)


def main(argv: list[str] | None = None) -> int:
    """python -m demo.report SPEC.json: plot_curves from a JSON spec (rows, path, title, panels, marks), for a
    caller whose own environment has no matplotlib (the e2e environment)."""
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text(encoding="utf-8"))
    panels = tuple((title, tuple(keys)) for title, keys in spec["panels"])
    plot_curves(spec["rows"], Path(spec["path"]), spec["title"], panels, [tuple(m) for m in spec["marks"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
