"""ray_start.sh and `ray_cluster start` as a node's shell runs them, without Ray (dry runs): the script finds its
Python as the launchers do (no venv on PATH), `ray start` is the `ray` installed beside that Python, a CPU node
(--cpu / PROFILE=cpu) offers the lowercase `cpu` resource verl's CPU bundles ask for with a small object store,
and the NPU node's command is what it was. The two faults the multi-node probe hit (a bare `python3`, then a
bare `ray`: a FileNotFoundError traceback) are each one line now."""

from __future__ import annotations

import os
import select
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ascend_rl import ray_cluster
from ascend_rl.cli import ray_cluster as cli
from ascend_rl.paths import REPO

RAY_START = REPO / "llm_rl" / "deepseek_r1" / "ray_start.sh"
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # a node's fresh shell: no venv activated


def _ray_start(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """bash ray_start.sh ARGS in a clean environment (PATH without a venv, SOCKET_IFNAME=lo, no PYTHON)."""
    base = {
        "PATH": BARE_PATH,
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "SOCKET_IFNAME": "lo",
    }
    return subprocess.run(
        ["bash", str(RAY_START), *args], capture_output=True, text=True, env={**base, **env}, timeout=120
    )


def _command(proc: subprocess.CompletedProcess) -> list[str]:
    """The `ray start` command a dry run prints."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if " start --node-ip-address=" in line]
    assert len(lines) == 1, proc.stdout
    return shlex.split(lines[0])


def _finds_hydra(python: str) -> bool:
    return (
        bool(python)
        and subprocess.run([python, "-c", "import hydra, omegaconf"], capture_output=True).returncode == 0
    )


def test_ray_start_finds_its_python_and_that_pythons_ray_without_a_venv_on_path():
    # scripts/find_python.sh's order for the CPU profile: python3 on PATH, .venv-e2e, .venv (the first with hydra), on
    # verl 0.6.0 (VERL_BASE; the recipe's default, 0.9.1, takes .venv-e2e-091 there: tests/launch/test_preflight.py)
    on_path = subprocess.run(
        ["bash", "-c", "command -v python3"], capture_output=True, text=True, env={"PATH": BARE_PATH}
    )
    candidates = [on_path.stdout.strip(), str(REPO / ".venv-e2e/bin/python"), str(REPO / ".venv/bin/python")]
    expected = next(c for c in candidates if c and Path(c).exists() and _finds_hydra(c))
    argv = _command(_ray_start(["--cpu", "--head", "--nodes", "2", "--dry-run"], VERL_BASE="0.6.0"))
    assert argv[0] == str(Path(expected).parent / "ray") and argv[1] == "start", argv
    # PYTHON names it outright
    argv = _command(_ray_start(["--worker", "10.1.2.3", "--dry-run"], PYTHON=sys.executable))
    assert argv[0] == str(Path(sys.executable).parent / "ray"), argv


def test_cpu_node_offers_cpu_resource_small_store_no_dashboard_and_npu_node_is_unchanged():
    npu = _command(_ray_start(["--head", "--nodes", "16", "--dry-run"], PYTHON=sys.executable))
    assert npu[1:] == [
        "start",
        "--node-ip-address=127.0.0.1",
        '--resources={"NPU": 16}',
        "--head",
        "--port=6379",
        "--dashboard-host=0.0.0.0",
    ]
    # a CPU node on verl 0.6.0 (0.9.1, the default base, adds Ray's GPU resource: the test below)
    cpu = _command(
        _ray_start(["--cpu", "--head", "--nodes", "2", "--dry-run"], PYTHON=sys.executable, VERL_BASE="0.6.0")
    )
    assert cpu[1:] == [
        "start",
        "--node-ip-address=127.0.0.1",
        '--resources={"NPU": 1, "cpu": 1}',
        "--object-store-memory=536870912",
        "--head",
        "--port=6379",
        "--include-dashboard=false",
    ]
    # PROFILE=cpu is --cpu (as for the launcher); NPUS_PER_NODE is the ranks per node; the store is settable
    worker = _command(
        _ray_start(
            ["--worker", "10.1.2.3", "--object-store-memory", "1G", "--dry-run"],
            PYTHON=sys.executable,
            PROFILE="cpu",
            NPUS_PER_NODE="2",
            VERL_BASE="0.6.0",
        )
    )
    assert worker[1:] == [
        "start",
        "--node-ip-address=127.0.0.1",
        '--resources={"NPU": 2, "cpu": 2}',
        "--object-store-memory=1073741824",
        "--address=10.1.2.3:6379",
    ]


def test_a_cpu_node_on_verl_0_9_1_also_offers_the_gpu_resource_its_cpu_platform_asks():
    """verl 0.9.1's CPU platform (the base's cpu_env VERL_PLATFORM=cpu) asks Ray's GPU per rank; 0.7.1's bundles do
    not, and its nodes' command is as before."""
    args = ["--cpu", "--head", "--nodes", "2", "--dry-run"]
    v091 = _command(_ray_start(args, PYTHON=sys.executable, VERL_BASE="0.9.1"))
    v071 = _command(_ray_start(args, PYTHON=sys.executable, VERL_BASE="0.7.1"))
    assert v091[1:4] == ["start", "--node-ip-address=127.0.0.1", '--resources={"NPU": 1, "cpu": 1}'], v091
    assert "--num-gpus=1" in v091, v091
    assert not [a for a in v071 if a.startswith("--num-gpus")], v071


def test_cpu_node_puts_the_cpu_verl_tree_on_the_raylets_pythonpath(tmp_path):
    # the raylet's workers inherit PYTHONPATH: on a CPU node the tree the CPU profile runs (verl-<base>-cpu)
    probe = tmp_path / "python"
    probe.write_text(
        f'#!/bin/sh\n[ "$1 $2 $3" = "-m ascend_rl resolve" ] && exec {sys.executable} "$@"\n'
        f'[ "$1" = -m ] && {{ echo "PYTHONPATH=$PYTHONPATH"; exit 0; }}\nexec {sys.executable} "$@"\n'
    )
    probe.chmod(0o755)
    cpu = _ray_start(["--cpu", "--worker", "10.1.2.3"], PYTHON=str(probe), VERL_BASE="0.6.0")
    npu = _ray_start(["--worker", "10.1.2.3"], PYTHON=str(probe), VERL_BASE="0.6.0")
    recipe = REPO / "llm_rl" / "deepseek_r1"
    # the last line: `ray_cluster start` (before it, the node's /dev/shm clean-up ran with the same probe); the
    # launchers' /dev/shm record (ascend_rl/shm_record) comes first after the repository, for the raylet's workers
    record = REPO / "ascend_rl" / "shm_record"
    cpu_last, npu_last = cpu.stdout.strip().splitlines()[-1], npu.stdout.strip().splitlines()[-1]
    assert f"PYTHONPATH={REPO}:{record}:{recipe}/verl-0.6.0-cpu" == cpu_last, cpu.stdout + cpu.stderr
    assert f"PYTHONPATH={REPO}:{record}:{recipe}/verl-0.6.0" == npu_last, npu.stdout + npu.stderr


def test_a_python_without_ray_or_a_bad_profile_is_one_line(tmp_path):
    fake = tmp_path / "python"  # has verl's config stack (the finder's check), not ray
    fake.write_text('#!/bin/sh\ncase "$*" in *hydra*) exit 0 ;; *) exit 1 ;; esac\n')
    fake.chmod(0o755)
    proc = _ray_start(["--head", "--dry-run"], PYTHON=str(fake))
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"ray_start.sh: {fake} has no ray; install the stack into it or set PYTHON to the Python ray is installed in"
    )
    bad = _ray_start(["--head", "--dry-run"], PYTHON=sys.executable, PROFILE="gpu")
    assert bad.returncode == 2 and bad.stderr.strip() == "ray_start.sh: PROFILE must be npu or cpu, not 'gpu'"


def test_ray_executable_is_the_one_beside_the_python(tmp_path):
    python, ray = tmp_path / "bin" / "python", tmp_path / "bin" / "ray"
    python.parent.mkdir()
    python.write_text("")
    with pytest.raises(ray_cluster.ClusterError) as err:
        ray_cluster.ray_executable(str(python))
    assert f"no `ray` command beside {python} (looked in {python.parent})" in str(err.value)
    assert "\n" not in str(err.value)
    ray.write_text("#!/bin/sh\n")
    ray.chmod(0o755)
    assert ray_cluster.ray_executable(str(python)) == str(ray)


def test_ray_cluster_start_without_ray_beside_its_python_is_one_line(tmp_path, monkeypatch, capsys):
    # the probe: `ray_cluster start` ran a bare `ray` and died with FileNotFoundError, a traceback
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(tmp_path / "scripts"))
    assert cli.main(["start", "--head", "--ifname", "lo", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ray_cluster: error: no `ray` command beside ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "size,expected", [("536870912", 536870912), ("512M", 512 * 1024**2), ("2g", 2 * 1024**3)]
)
def test_object_store_sizes(size, expected):
    args = cli.parse_args(["start", "--worker", "10.1.2.3", "--object-store-memory", size])
    assert args.object_store_memory == expected


def test_object_store_below_rays_minimum_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["start", "--head", "--object-store-memory", "10M"])
    assert exc.value.code == 2
    assert "must be a size of at least 75M (Ray's minimum), not '10M'" in capsys.readouterr().err


def test_the_head_wait_says_each_count_as_it_changes_through_a_pipe():
    # progress lines are flushed: through `| tee` or a cluster's exec they appear while the head waits
    code = (
        "from ascend_rl import ray_cluster\n"
        "import sys, time\n"
        "counts = iter([1, 2])\n"
        "ray_cluster.wait_for_nodes(lambda: next(counts), 2, 60, sleep=lambda s: time.sleep(30))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO)},
    )
    try:
        assert select.select([proc.stdout], [], [], 20)[0], "no progress line while the head waits"
        assert proc.stdout.readline() == "ray: 1/2 nodes alive\n"
    finally:
        proc.kill()
        proc.wait()


def test_an_interface_the_node_lacks_is_one_line_naming_what_it_has():
    # issue 35 item 5a: SOCKET_IFNAME naming an interface this machine lacks; nothing printed but the one line
    proc = _ray_start(["--cpu", "--head", "--nodes", "2"], PYTHON=sys.executable, SOCKET_IFNAME="ib9")
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        "ray_cluster: error: interface 'ib9' has no IPv4 address (no such interface here); this node has: "
    ), proc.stderr
    assert "lo 127.0.0.1" in proc.stderr, proc.stderr


def _start_probe(tmp_path: Path, tree: Path) -> Path:
    """A PYTHON that runs everything with this interpreter except the node's real `ray_cluster start` (not its dry
    run): that one says whether the verl tree was there when Ray would have started, and starts nothing."""
    probe = tmp_path / "python"
    probe.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *"ray_cluster start"*--dry-run*) ;;\n'
        f'  *"ray_cluster start"*) [ -f {shlex.quote(str(tree))}/verl/__init__.py ] && echo "tree at start"; '
        "echo started; exit 0 ;;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    probe.chmod(0o755)
    return probe


def test_a_fresh_node_makes_the_verl_tree_before_its_ray_starts(tmp_path):
    """The first run on a fresh checkout: ray_start.sh runs on every node before the launcher, whose preflight used
    to be what fetched and patched the tree, so each node's Ray (and the workers Ray starts with it) came up with a
    PYTHONPATH entry that did not exist yet, and the launcher's node check found verl absent on every node. The
    node now makes the tree first, as the preflight makes it: fetched, the whole series applied; a dry run says so
    and writes nothing."""
    from ascend_rl import manifest, overlay

    tree = tmp_path / "verl-tree"
    probe = _start_probe(tmp_path, tree)
    dry = _ray_start(
        ["--cpu", "--worker", "10.1.2.3", "--dry-run"],
        PYTHON=str(probe),
        VERL_BASE="0.7.1",
        VERL_DIR=str(tree),
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"ray_start.sh: verl tree: would fetch verl 0.7.1 into {tree} and apply the " in dry.stderr, (
        dry.stderr
    )
    assert not tree.exists()

    run = _ray_start(
        ["--cpu", "--worker", "10.1.2.3"], PYTHON=str(probe), VERL_BASE="0.7.1", VERL_DIR=str(tree)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-2:] == ["tree at start", "started"], run.stdout + run.stderr
    spec = manifest.resolve_launch("deepseek_r1", "0.7.1", "cpu").recipe
    states = overlay.apply_checked(spec, overlay.resolve_target(spec, tree), dry_run=True, log=lambda m: None)
    assert [s.state for s in states] == [overlay.APPLIED] * len(spec.series)
    assert f"ray_start.sh: verl tree: {tree} (verl 0.7.1, fetched, " in run.stderr, run.stderr

    # the next start on the node (Ray restarted, a second node on a shared disk) finds it ready: nothing to do
    again = _ray_start(
        ["--cpu", "--worker", "10.1.2.3"], PYTHON=str(probe), VERL_BASE="0.7.1", VERL_DIR=str(tree)
    )
    assert again.returncode == 0 and "tree at start" in again.stdout, again.stdout + again.stderr
    assert "fetched" not in again.stderr, again.stderr


def test_a_tree_the_node_cannot_make_ready_is_one_line_and_no_ray(tmp_path):
    """VERL_DIR holding another verl: the node refuses in one line naming the tree and starts no Ray; the user's
    tree is left as it was."""
    tree = tmp_path / "mine"
    (tree / "verl" / "version").mkdir(parents=True)
    (tree / "verl" / "__init__.py").write_text("")
    (tree / "verl" / "version" / "version").write_text("0.5.0\n")
    before = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    probe = _start_probe(tmp_path, tree)
    proc = _ray_start(
        ["--cpu", "--worker", "10.1.2.3"], PYTHON=str(probe), VERL_BASE="0.7.1", VERL_DIR=str(tree)
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "started" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("resolve: error: ") and str(tree) in errors[0], (
        proc.stderr
    )
    assert sorted(p.relative_to(tree) for p in tree.rglob("*")) == before
