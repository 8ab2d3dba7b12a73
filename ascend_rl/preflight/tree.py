"""The launch's verl tree: planned without writing to it, then made ready through the overlay library.

The plan reads a patched view (the tree itself, or a patched copy in a scratch folder) and says what a real launch
changes; once every check passed, `prepare_tree` fetches and applies through `overlay.prepare`, the same library
`overlay apply --fetch` uses: one way patches are applied."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ascend_rl import artifacts, overlay
from ascend_rl.errors import OverlayError
from ascend_rl.manifest import Launch
from ascend_rl.preflight.report import Check, PreflightError


@dataclass
class TreePlan:
    """The verl tree a launch uses, read without writing to it."""

    check: Check  # the report's line
    view: Path  # where the patched tree can be read now: the tree itself, or a patched copy in the scratch folder
    change: str | None  # what a real launch writes to the tree first (None: nothing)


def _named(launch: Launch) -> str:
    """How the overlay command names the launch's series ("qwen2_5 --with cpu")."""
    return launch.recipe.name.replace("+", " --with ")


def _disposable(launch: Launch, verl_dir: Path) -> bool:
    """Whether `verl_dir` is the overlay's own tree of the launch (rebuilt when stale), not a user's."""
    return launch.disposable and verl_dir.resolve() == launch.verl_dir.resolve()


def fetch_change(launch: Launch, verl_dir: Path) -> str | None:
    """What a real launch does first to `verl_dir` when it holds no verl package yet (None: it holds one)."""
    if (verl_dir / "verl" / "__init__.py").is_file():
        return None
    spec = launch.recipe
    return (
        f"fetch verl {spec.version} into {verl_dir} and apply the {len(spec.series)} patches of "
        f"{_named(launch)} (verl {spec.version})"
    )


def plan_tree(launch: Launch, verl_dir: Path, scratch: Path) -> TreePlan:
    """What the launch's tree needs (fetch, patches, a rebuild) and a patched view of it, writing only under
    `scratch`: the tree itself when the series is on it, else a copy of its verl/ package (or the pinned sdist,
    when there is no tree yet) with the series applied. PreflightError when the series does not go on a
    user's tree."""
    spec = launch.recipe
    named = f"{_named(launch)} (verl {spec.version})"
    quiet = lambda message: None  # noqa: E731 (what the overlay says about the scratch copy is nobody's business)
    try:
        change = fetch_change(launch, verl_dir)
        if change:
            detail = f"{verl_dir} (absent: a real launch fetches it)"
        else:
            try:
                states = overlay.apply_checked(
                    spec, overlay.resolve_target(spec, verl_dir), dry_run=True, log=quiet
                )
            except OverlayError as exc:
                if not _disposable(launch, verl_dir):
                    raise
                change = f"rebuild {verl_dir} (it does not take the series any more: {exc})"
                detail = f"{verl_dir} (stale: a real launch rebuilds it)"
            else:
                todo = [s.patch.name for s in states if s.state == overlay.APPLICABLE]
                if not todo:
                    return TreePlan(
                        Check(
                            "verl tree", "ok", f"{verl_dir} (all {len(states)} patches of {named} applied)"
                        ),
                        verl_dir,
                        None,
                    )
                view = scratch / "verl-tree"
                shutil.copytree(
                    verl_dir / "verl", view / "verl", ignore=shutil.ignore_patterns("__pycache__")
                )
                overlay.apply_series(spec, view, log=quiet)
                which = (
                    f"the {len(todo)}" if len(todo) == len(states) else f"{len(todo)} of the {len(states)}"
                )
                change = f"apply {which} patches of {named} to {verl_dir}" + (
                    f": {', '.join(todo)}" if len(todo) < len(states) else ""
                )
                detail = (
                    f"{verl_dir} ({len(todo)} of {len(states)} patches to apply: checked on a patched copy)"
                )
                return TreePlan(Check("verl tree", "ok", detail), view, change)
        # the pinned sdist is read from the download cache, fetched into it first when absent: the one thing a dry
        # run leaves behind, said in its line (a real launch would fetch it anyway)
        cached = (artifacts.cache_dir() / spec.sdist).is_file()
        view = overlay.materialise(spec, scratch / "verl-tree", log=quiet)
        if not cached:
            detail += f"; downloaded {spec.sdist} into {artifacts.cache_dir()} to check against"
    except artifacts.DownloadError as exc:
        raise PreflightError(
            f"{verl_dir} has no verl tree and the pinned one cannot be fetched: {exc}; without the network, "
            f"put {spec.sdist} (sha256 {spec.sdist_sha256}) into {artifacts.cache_dir()} (RECIPES_CACHE), "
            f"or set VERL_DIR to a verl {spec.version} tree"
        ) from exc
    except OverlayError as exc:
        raise PreflightError(f"overlay apply {named} on {verl_dir} failed: overlay: error: {exc}") from exc
    return TreePlan(Check("verl tree", "ok", detail), view, change)


def prepare_tree(launch: Launch, verl_dir: Path, log: Callable[[str], None] | None = None) -> Check:
    """Fetch the pinned verl tree when absent, then apply the launch's series (a no-op when applied), through
    `overlay.prepare`. The overlay's own tree (the launch's default for an overlay, llm_rl/<recipe>/verl-<base>-cpu)
    is rebuilt when the series no longer applies to it, said through `log` (default: stderr); any other tree is
    the user's: a refusal is reported, nothing is removed."""
    say = log or (lambda m: print(m, file=sys.stderr))
    try:
        done = overlay.prepare(
            launch.recipe,
            verl_dir,
            disposable=_disposable(launch, verl_dir),
            log=lambda m: say(f"preflight: {m}"),
        )
    except OverlayError as exc:
        raise PreflightError(str(exc)) from exc
    fetched = f"{done.how}, " if done.how else ""
    said = done.said[-1] if done.said else "done"
    return Check("verl tree", "ok", f"{verl_dir} (verl {launch.base}, {fetched}{said})")
