"""The overlay command: fetch a recipe's pinned verl tree and apply, check or revert its patch series.

    python3 -m ascend_rl overlay fetch  qwen2_5
    python3 -m ascend_rl overlay status qwen2_5 [--target DIR] [--wait SECONDS]
    python3 -m ascend_rl overlay apply  qwen2_5 [--target DIR] [--dry-run] [--force] [--wait SECONDS] [--fetch]
    python3 -m ascend_rl overlay revert qwen2_5 [--target DIR] [--dry-run] [--force] [--wait SECONDS]
    python3 -m ascend_rl overlay clean  qwen2_5 [--target DIR] [--dry-run] [--wait SECONDS]
    python3 -m ascend_rl overlay apply  qwen2_5 --with cpu    # the recipe's series, then patches/cpu/
    python3 -m ascend_rl overlay fetch  qwen2_5 --base 0.6.0  # another verl base of the recipe
    python3 -m ascend_rl overlay export deepseek_r1 --out DIR  # the series as plain diffs for git apply / quilt

A recipe serves one or more verl bases (recipe.toml [bases."VERSION"], each with its own series);
--base picks one (default: the manifest's default_base; `list` shows them). The default tree is
llm_rl/<recipe>/verl-<base>/. Without --base, a --target tree that is another base of the recipe (by its
verl/version/version; in a pip-installed tree, its verl-*.dist-info must agree) gets that base's series,
said in one line. A tree of any other version is named by what it is (its version file and the content
of the files the series touch, patches/trees.toml) and refused in one line.

`revert` refuses, changing nothing, when the tree carries another series on top of this one (DeepSeek's
on the patches it shares with Qwen's, an overlay's): taking this one off would leave those on a base
without the patches beneath them. A patch applied, then edited by hand is reported `edited` (the file,
hunk, the lines the patch expects and those found), and stops an apply or a revert.

Every command holds an advisory lock on the tree (ROOT/.overlay.lock; a second copy waits up to
--wait seconds, then refuses), and every write goes through a journal in the tree's root
(ROOT/.overlay-txn/): a command killed at any point, even by power loss, is finished by the next
apply or revert, and `status` reports it until then (the protocol: ascend_rl/journal.py).

An overlay (`--with NAME`, manifest patches/NAME/overlay.toml) is a series applied on top of a
recipe's, into a tree of its own (default llm_rl/<recipe>/verl-NAME/): the CPU series that tests
and the CPU launch profile need, never applied by a recipe launcher on an NPU host.

`clean` removes what an earlier apply left in a tree whose verl was uninstalled or reinstalled since (pip removes
the files its RECORD lists, not the modules the series added): only files byte for byte what a series of this
repository installs at their path, in a tree whose verl is gone or, with them set aside, as released; `status`
and `apply` name them in one line. Nothing else is removed.

`export` writes the series as self-contained diffs (each module a patch installs, `Installs:` in its header,
becomes a new-file section) and a quilt `series` file into a new folder, for `git apply`, `patch -p1` or quilt
on a machine without this repository; the overlay itself (atomic, journalled, reversible) stays the way to apply.

Exit status: 0 done, 1 refused or conflicting, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ascend_rl import manifest, overlay, patchset
from ascend_rl.errors import EXIT_OK, EXIT_REFUSED, OverlayError
from ascend_rl.journal import DEFAULT_WAIT
from ascend_rl.paths import REPO


def _say(text: str, stream=None) -> None:
    """Print one line; a reader that went away (`status | head`) silences the rest, not the work."""
    stream = sys.stdout if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        _silence(stream)


def _err(text: str) -> None:
    _say(text, sys.stderr)


def _silence(stream) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def _print_states(states: list[overlay.PatchState], root: Path) -> None:
    for st in states:
        rel = st.patch.source.relative_to(REPO) if st.patch.source.is_relative_to(REPO) else st.patch.source
        ident = patchset.patch_id(st.patch.source) or "-"
        _say(f"  {st.state:<11} {ident:<12} {rel}")
        if st.detail:
            label = {overlay.EDITED: "applied, then edited: ", overlay.CARRIED: "already carried: "}
            _say(f"              {label.get(st.state, '')}{st.detail}")
        for line in st.lines or []:
            _say(f"                | {line}")
        if st.next_step:
            _say(f"              next: {st.next_step}")


def _print_pending(recipe: manifest.Recipe) -> None:
    """The ports the base still lacks (recipe.toml's `pending` table): one row each, with what ports it."""
    if recipe.pending:
        _say(
            f"  not yet ported to {recipe.project} {recipe.version} ({len(recipe.pending)}; an NPU launch is refused until they are):"
        )
    for ident, what in recipe.pending.items():
        _say(f"  {'pending':<11} {ident:<12} {what}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return _run(args)
    except OverlayError as exc:
        _err(f"overlay: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _err(
            "overlay: interrupted; `status` says where the tree stands, "
            "and the next apply or revert finishes any write that was under way"
        )
        return 130
    except BrokenPipeError:  # argparse's help or usage text into a closed pipe
        _silence(sys.stdout)
        _silence(sys.stderr)
        return EXIT_REFUSED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m ascend_rl overlay",
        description="Fetch a recipe's pinned verl tree and apply, check or revert its patch series.",
        epilog="Exit status: 0 done, 1 refused or conflicting, 2 usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_fetch = sub.add_parser(
        "fetch", help="materialise the base's pinned tree at llm_rl/<recipe>/verl-<base>/"
    )
    p_fetch.add_argument(
        "--source",
        choices=("auto", "git", "sdist"),
        default="auto",
        help="git clone at the tag, the pip source distribution, or git then sdist (default)",
    )
    p_fetch.add_argument("--dest", help="fetch into this folder instead of llm_rl/<recipe>/verl-<base>/")
    p_fetch.add_argument("--dry-run", action="store_true", help="say what would be fetched, change nothing")
    for name, text in (
        (
            "status",
            "show each patch as applied / applicable / conflicting / edited (applied, then edited by hand) / "
            "carried (the tree already has the fix)",
        ),
        ("apply", "apply the series (atomic, idempotent)"),
        ("revert", "take the series back off, last patch first (atomic)"),
        (
            "clean",
            "remove the modules an earlier apply left in a tree whose verl was uninstalled or reinstalled",
        ),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--target", help="a folder holding verl/ (checkout, unpacked sdist, site-packages)")
        if name != "clean":
            p.add_argument("--force", action="store_true", help="accept a tree of another verl version")
        p.add_argument(
            "--wait",
            type=float,
            default=DEFAULT_WAIT,
            metavar="SECONDS",
            help=f"how long to wait for another overlay command on the same tree (default {DEFAULT_WAIT:g})",
        )
        if name != "status":
            p.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
    sub.choices["apply"].add_argument(
        "--fetch", action="store_true", help="without --target: fetch the recipe's tree first if it is absent"
    )
    p_export = sub.add_parser(
        "export", help="write the series as plain diffs and a quilt series file (git apply / patch -p1)"
    )
    p_export.add_argument("--out", required=True, help="a new (or empty) folder to write into")
    p_export.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    p_list = sub.add_parser("list", help="list the recipes and overlays, or one recipe's series in order")
    p_list.add_argument("recipe", nargs="?", help="show this recipe's patches, in series order")
    p_list.add_argument("--with", dest="overlay", metavar="OVERLAY", help="with this overlay's series on top")
    for p in (p_list, p_fetch, p_export, *[sub.choices[n] for n in ("status", "apply", "revert", "clean")]):
        p.add_argument(
            "--base",
            metavar="VERSION",
            help="the verl base whose pin and series to use (default: the recipe's default_base"
            + (
                "; with --target, the base that tree is, when it is one of the recipe's)"
                if p not in (p_list, p_fetch, p_export)
                else ")"
            ),
        )
    for p in (p_fetch, p_export, *[sub.choices[n] for n in ("status", "apply", "revert", "clean")]):
        p.add_argument("recipe", help=f"recipe name ({', '.join(manifest.recipe_names())}) or folder")
        p.add_argument(
            "--with",
            dest="overlay",
            metavar="OVERLAY",
            help=f"also the series of patches/OVERLAY/ on top ({', '.join(manifest.overlay_names()) or 'none'}); "
            "default tree llm_rl/<recipe>/verl-<base>-OVERLAY/",
        )
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "list" and args.recipe:
        recipe = manifest.load_recipe(args.recipe, args.base)
        if args.overlay:
            recipe = manifest.with_overlay(recipe, args.overlay)
        _say(f"{recipe.name}: {recipe.project} {recipe.version}, {len(recipe.series)} patches, in order:")
        for patch in recipe.series:
            rel = patch.relative_to(REPO) if patch.is_relative_to(REPO) else patch
            _say(f"  {patchset.patch_id(patch) or '-':<12} {rel}")
        _print_pending(recipe)
        return EXIT_OK
    if args.command == "list":
        for name in manifest.recipe_names():
            for recipe in manifest.recipe_bases(name):
                mark = " (default)" if recipe.version == recipe.default and len(recipe.bases) > 1 else ""
                note = f"; {recipe.note}" if recipe.note else ""
                pending = f" ({len(recipe.pending)} not yet ported)" if recipe.pending else ""
                _say(
                    f"{name}: {recipe.project} {recipe.version}{mark}, {len(recipe.series)} patches{pending}, "
                    f"tree {recipe.default_target.relative_to(REPO)}/{note}"
                )
        for name in manifest.overlay_names():
            _say(f"--with {name}: patches/{name}/overlay.toml (on top of a recipe's series)")
        return EXIT_OK
    recipe = manifest.load_recipe(args.recipe, args.base)
    if args.command not in ("fetch", "export") and args.base is None and args.target is not None:
        # a tree of another base of the recipe is patched on that base; --base, when given, decides
        base, line = overlay.place(recipe, args.target)
        if base is not None:
            recipe = manifest.load_recipe(args.recipe, base)
            _err(f"overlay: {line}")
    if args.overlay:
        recipe = manifest.with_overlay(recipe, args.overlay)
    if args.command == "export":
        return _export(recipe, Path(args.out), args.dry_run)
    if args.command == "fetch":
        dest = Path(args.dest) if args.dest else recipe.default_target
        if args.dry_run:
            state = f"exists ({overlay.tree_version(dest, recipe.project)})" if dest.exists() else "absent"
            _say(f"would fetch {recipe.project} {recipe.version} ({args.source}) into {dest} [{state}]")
            return EXIT_OK
        overlay.fetch(recipe, args.source, dest, log=_say)
        return EXIT_OK
    if args.command == "clean":
        return _clean(recipe, args)
    if args.command == "apply" and args.fetch and args.target is None and not args.dry_run:
        overlay.fetch(recipe, "auto", recipe.default_target, log=_say)
    root = overlay.resolve_target(recipe, args.target, args.force)
    if args.command == "status":
        states, pending = overlay.inspect_tree(recipe, root, args.wait, _err)
        _say(
            f"{recipe.name}: {len(states)} patches on {root} ({recipe.project} {overlay.tree_version(root)})"
        )
        blocked = any(st.state in overlay.BLOCKED for st in states)
        left = overlay.leftovers_of(recipe, root, args.wait) if pending is None and blocked else None
        if pending:
            _say(f"  {pending.summary()}; the states below are the tree's once it does")
        elif note := overlay.leftovers(root):
            _say(f"  {note}; the next apply or revert removes them")
        if left is not None:
            _say(f"  leftovers: {left.line(recipe)}")
            for st in states:
                if st.state in overlay.BLOCKED:
                    st.next_step = "remove the leftovers named above (`overlay clean`), then apply"
        overlay.pip_advice(recipe, root, states)
        _print_states(states, root)
        _print_pending(recipe)
        # another recipe's series on the tree explains files that differ from the release: name it, not local edits
        carried = overlay.carried_series(recipe, root, args.wait)
        if not carried and left is None and (note := overlay.content_note(recipe, root, args.wait)):
            _say(f"  note: {note}")
        if note := overlay.installed_note(root, recipe.project):
            _say(f"  note: {note}")
        if carried:
            _say(f"  {carried}")
        return EXIT_REFUSED if pending or any(s.state in overlay.BLOCKED for s in states) else EXIT_OK
    if args.command == "apply":
        states = overlay.apply_checked(recipe, root, args.dry_run, args.force, args.wait, _say)
        for line in overlay.apply_summary(recipe, root, states, args.dry_run):
            _say(line)
        if note := overlay.installed_note(root, recipe.project):
            _say(f"note: {note}")
        return EXIT_OK
    states = overlay.revert_series(recipe, root, args.dry_run, args.force, args.wait, _say)
    for line in overlay.revert_summary(recipe, root, states, args.dry_run):
        _say(line)
    return EXIT_OK


def _clean(recipe: manifest.Recipe, args: argparse.Namespace) -> int:
    """`clean`: the leftovers of an earlier apply removed (or, --dry-run, listed), one line each, then a closing line."""
    target = Path(args.target) if args.target else recipe.default_target
    found = overlay.clean_leftovers(recipe, target, args.dry_run, args.wait, _say)
    if found is None:
        _say(f"{recipe.name}: no module an earlier apply left on {target.resolve()}; nothing to clean")
        return EXIT_OK
    for rel in [*found.files, *found.caches]:
        _say(f"  remove  {rel}")
    for rel in found.kept:
        _say(f"  kept {rel}: not what a series of this repository installs there; check it and move it away")
    did = "would have removed" if args.dry_run else "removed"
    dry = " (dry run: nothing removed)" if args.dry_run else ""
    then = (
        f"install {recipe.project} ({recipe.project}=={recipe.version}), then apply"
        if found.absent
        else f"its {recipe.project} is as released: `overlay apply {recipe.cli} --target {found.root}` patches it"
    )
    _say(
        f"{recipe.name}: {did} {len(found.files)} modules an earlier apply left on {found.root}"
        f"{f' and their {len(found.caches)} bytecode files' if found.caches else ''}{dry}; {then}"
    )
    return EXIT_OK


def _export(recipe: manifest.Recipe, out: Path, dry_run: bool) -> int:
    """The series as self-contained diffs plus a quilt series file, written into a new folder whole or not at all."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OverlayError(f"{out} exists and is not an empty folder; pass a new --out")
    try:
        texts = [(path.name, patchset.self_contained(path)) for path in recipe.series]
    except patchset.PatchError as exc:
        raise OverlayError(f"{exc}; nothing was written") from exc
    if dry_run:
        _say(
            f"would write {len(texts)} patches of {recipe.name} ({recipe.project} {recipe.version}) and a series file to {out}"
        )
        return EXIT_OK
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, data in texts:
            (tmp / name).write_bytes(data)
        (tmp / "series").write_text("".join(f"{name}\n" for name, _ in texts))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say(
        f"wrote {len(texts)} patches of {recipe.name} ({recipe.project} {recipe.version}) and their series to {out}; "
        f"apply them in order: cd <verl tree> && for p in $(cat {out}/series); do git apply {out}/$p; done"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
