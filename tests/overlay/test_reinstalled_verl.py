"""A pip-installed verl the overlay patched, then uninstalled and reinstalled (issue 61, item 1): pip removes the
files its RECORD lists, so the modules the series installed (`Installs:` in the patches' headers) stay behind. The
overlay names them in one line, `overlay clean` removes them (only the files whose content is what the overlay
installs; `--dry-run` lists them), and the reinstalled verl then takes the series again. The pip install and
uninstall are done here as pip does them (RECORD), on the real 0.9.1 sdist tree."""

from __future__ import annotations

import base64
import hashlib
import os
import py_compile
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from test_edited_trees import cli, tree_bytes

from ascend_rl import journal, manifest
from ascend_rl.paths import REPO

BASE = "0.9.1"
RECIPE = "deepseek_r1"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pip_install(pristine: Path, site: Path) -> None:
    """verl's files and a dist-info whose RECORD lists each of them, as `pip install --no-deps verl` leaves them."""
    shutil.copytree(pristine / "verl", site / "verl", dirs_exist_ok=True)  # over what an uninstall left
    info = site / f"verl-{BASE}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {BASE}\n")
    (info / "INSTALLER").write_text("pip\n")
    files = [site / p.relative_to(pristine) for p in (pristine / "verl").rglob("*") if p.is_file()]
    rows = [
        f"{p.relative_to(site).as_posix()},{_record_hash(p.read_bytes())},{p.stat().st_size}"
        for p in sorted([*files, *info.iterdir()])
    ]
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")


def pip_uninstall(site: Path) -> None:
    """`pip uninstall verl`: every file RECORD lists (and its bytecode) removed, then the folders left empty."""
    info = site / f"verl-{BASE}.dist-info"
    folders = set()
    for row in (info / "RECORD").read_text().splitlines():
        path = site / row.split(",")[0]
        path.unlink(missing_ok=True)
        if path.suffix == ".py":
            for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                cached.unlink()
        folders.update([path.parent, path.parent / "__pycache__"])
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def patches():
    from ascend_rl import overlay

    return overlay.load_series(manifest.load_recipe(RECIPE, BASE))


def installed_modules() -> list[str]:
    """The files the series adds to verl (each patch's `Installs:` DEST)."""
    return sorted(fp.path for p in patches() for fp in p.files if fp.old_path is None)


def test_a_reinstalled_verl_is_cleaned_of_the_modules_an_apply_left_and_patched_again(
    tmp_path, pristine_base
) -> None:
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    pip_install(pristine_base(BASE), site)
    fresh = tree_bytes(site)
    n = len(manifest.load_recipe(RECIPE, BASE).series)
    modules = installed_modules()
    assert len(modules) >= 4 and all(m.startswith("verl/") for m in modules), modules

    apply = cli("apply", RECIPE, "--base", BASE, "--target", site)
    assert apply.returncode == 0 and f"applied {n} of {n} patches" in apply.stdout, apply.stderr
    # the patched verl was imported once: its bytecode sits beside the modules the series installed
    py_compile.compile(str(site / modules[0]), cfile=str(site / bytecode(modules[0])))

    pip_uninstall(site)
    left = sorted(str(p.relative_to(site)) for p in (site / "verl").rglob("*") if p.is_file())
    assert left == sorted(
        [*modules, bytecode(modules[0])]
    )  # what pip leaves behind: `import verl` still works

    # verl gone, its modules not: each command says what they are and what removes them, in one line
    for verb in ("status", "apply"):
        proc = cli(verb, RECIPE, "--target", site)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1, proc.stderr
        assert f"{len(modules)} modules an earlier `overlay apply` installed" in err[0], err
        assert "verl was uninstalled" in err[0] and f"overlay clean {RECIPE} --target {site}" in err[0], err

    pip_install(
        pristine_base(BASE), site
    )  # `pip install verl==0.9.1`: pristine files, the leftovers still there
    reinstalled = tree_bytes(site)
    status = cli("status", RECIPE, "--target", site)
    assert status.returncode == 1, status.stdout
    assert (
        f"{len(modules)} modules an earlier `overlay apply` installed are left in a reinstalled verl"
        in status.stdout
    )
    assert f"overlay clean {RECIPE} --target {site}" in status.stdout, status.stdout
    assert "overlay fetch" not in status.stdout, status.stdout  # a site-packages tree is not fetched
    apply = cli("apply", RECIPE, "--target", site)
    assert apply.returncode == 1 and f"overlay clean {RECIPE} --target {site}" in apply.stderr, apply.stderr
    assert tree_bytes(site) == reinstalled

    dry = cli("clean", RECIPE, "--target", site, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert all(f"remove  {m}" in dry.stdout for m in [*modules, bytecode(modules[0])]), dry.stdout
    assert tree_bytes(site) == reinstalled  # a dry run changes nothing

    clean = cli("clean", RECIPE, "--target", site)
    assert clean.returncode == 0, clean.stderr
    assert f"removed {len(modules)} modules" in clean.stdout, clean.stdout
    assert tree_bytes(site) == fresh  # exactly pip's verl, nothing else removed
    again = cli("clean", RECIPE, "--target", site)
    assert again.returncode == 0 and "nothing to clean" in again.stdout, again.stdout

    apply = cli("apply", RECIPE, "--target", site)
    assert apply.returncode == 0 and f"applied {n} of {n} patches" in apply.stdout, apply.stderr
    assert cli("status", RECIPE, "--target", site).stdout.count(" applied ") == n


def bytecode(module: str) -> str:
    path = Path(module)
    return str(path.parent / "__pycache__" / f"{path.stem}.cpython-311.pyc")


def test_clean_after_an_uninstall_leaves_no_verl_and_keeps_what_the_overlay_did_not_install(
    tmp_path, pristine_base
) -> None:
    site = tmp_path / "site-packages"
    pip_install(pristine_base(BASE), site)
    assert cli("apply", RECIPE, "--target", site).returncode == 0
    pip_uninstall(site)
    modules = installed_modules()
    edited = site / modules[1]
    edited.write_bytes(edited.read_bytes() + b"# my own line\n")  # not what the overlay installed: kept
    kept = edited.read_bytes()
    (site / "other.py").write_text("x = 1\n")  # beside verl, never the overlay's

    clean = cli("clean", RECIPE, "--target", site)
    assert clean.returncode == 0, clean.stderr
    assert f"removed {len(modules) - 1} modules" in clean.stdout, clean.stdout
    assert f"kept {modules[1]}" in clean.stdout, clean.stdout
    assert edited.read_bytes() == kept and (site / "other.py").read_text() == "x = 1\n"
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == sorted(
        [modules[1], "other.py"]
    )

    edited.unlink()
    clean = cli("clean", RECIPE, "--target", site)
    assert clean.returncode == 0 and "nothing to clean" in clean.stdout, clean.stdout


def test_clean_leaves_a_patched_tree_alone(tmp_path, pristine_base) -> None:
    site = tmp_path / "site-packages"
    pip_install(pristine_base(BASE), site)
    assert cli("apply", RECIPE, "--target", site).returncode == 0
    patched = tree_bytes(site)
    clean = cli("clean", RECIPE, "--target", site)  # the modules belong to the applied series: not leftovers
    assert clean.returncode == 0 and "nothing to clean" in clean.stdout, clean.stdout
    assert tree_bytes(site) == patched


def test_a_pip_installed_tree_is_told_to_reinstall_not_to_fetch(tmp_path, pristine_base) -> None:
    site = tmp_path / "site-packages"
    pip_install(pristine_base(BASE), site)
    assert cli("apply", RECIPE, "--target", site).returncode == 0
    # one patched file back as released (a partial reinstall): the patch on it is half on
    changed = next(fp.path for p in patches() for fp in p.files if fp.old_path is not None)
    shutil.copyfile(pristine_base(BASE) / changed, site / changed)
    status = cli("status", RECIPE, "--target", site)
    assert status.returncode == 1 and " conflicting " in status.stdout, status.stdout
    assert f"pip install --force-reinstall --no-deps verl=={BASE}" in status.stdout, status.stdout
    assert "overlay fetch" not in status.stdout and "leftovers" not in status.stdout, status.stdout


def test_clean_killed_at_every_file_boundary_is_finished_by_the_next(tmp_path, pristine_base) -> None:
    site = tmp_path / "site-packages"
    pip_install(pristine_base(BASE), site)
    fresh = tree_bytes(site)
    assert cli("apply", RECIPE, "--target", site).returncode == 0
    pip_uninstall(site)
    pip_install(pristine_base(BASE), site)
    left = tree_bytes(site)
    for n in range(1, 40):
        for rel in set(tree_bytes(site)) - set(left):
            (site / rel).unlink()
        for rel, data in left.items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
        env = {**os.environ, journal.CRASH_ENV: str(n)}
        killed = subprocess.run(
            [sys.executable, "-m", "ascend_rl", "overlay", "clean", RECIPE, "--target", str(site)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=300,
        )
        again = cli("clean", RECIPE, "--target", site)
        assert again.returncode == 0, (n, again.stderr)
        assert tree_bytes(site) == fresh, n
        if killed.returncode == 0:  # it ran out of file operations to be killed after
            break
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr)
    assert n > 3
