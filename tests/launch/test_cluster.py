"""The simulated cluster (ascend_rl.harness.sim_cluster, `python3 -m ascend_rl sim_cluster`): nodes in their own
namespaces, a TCP connection between two of them, the shared and node-local folders, and teardown that leaves no
namespace, link, mount or process behind on every way its holder ends. No Ray, no training: each cluster is up in well
under a second. Skips (with the reason) without root or `ip netns`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_rl.harness import sim_cluster as lib
from ascend_rl.harness.sim_cluster import __main__ as cli
from ascend_rl.paths import REPO, child_env
from cluster_support import NO_CLUSTER

if NO_CLUSTER:
    pytest.skip(NO_CLUSTER, allow_module_level=True)

PY = sys.executable
TOOL = [PY, "-m", "ascend_rl", "sim_cluster"]
# A hang, not a measurement: up and down take well under a second on a quiet machine, but a fresh CI run beside
# training runs once took over 30 s to tear a cluster down after SIGINT (load average ~25 on 2 cores).
LIMIT_S = 120


def _name(tag: str) -> str:
    return f"t{os.getpid()}-{tag}"


def _tool(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TOOL, *args], capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=60, **kwargs
    )


def _new(tmp_path: Path, tag: str, nodes: int = 2) -> lib.Cluster:
    (tmp_path / "rt").mkdir(exist_ok=True)
    return lib.Cluster(_name(tag), nodes, root=tmp_path / tag, ray_tmpdir=tmp_path / "rt")


def _sh(cl: lib.Cluster, node: str, script: str) -> subprocess.CompletedProcess:
    return cl.run(node, ["sh", "-c", script], capture_output=True, text=True, timeout=30)


def leftovers(rec: dict) -> list[str]:
    """What is left of a cluster (its state record, taken while it was up): the state file, its network
    namespaces (`ip netns list`), links (`ip link`), mounts (/proc/mounts), processes (its recorded pids, and
    any process whose command line names its folder)."""
    left = []
    if lib.state_file(rec["name"]).exists():
        left.append("state file")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    ]
    left += [f"netns {n['netns']}" for n in rec["nodes"] if n["netns"] in netns]
    left += [f"link {link}" for link in [rec["bridge"], *(n["link"] for n in rec["nodes"])] if link in links]
    mounts = Path("/proc/mounts").read_text()
    left += [
        f"mount of {what}" for what in [rec["root"], *(n["netns"] for n in rec["nodes"])] if what in mounts
    ]
    for node in rec["nodes"]:
        for pid, start in (
            (node["init_pid"], node["init_start"]),
            (node["unshare_pid"], node["unshare_start"]),
        ):
            if pid and lib.start_time(pid) == start:
                left.append(f"{node['name']} pid {pid}")
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (
                    Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
            if rec["root"] in cmdline and lib.start_time(int(entry.name)) is not None:
                left.append(f"process {entry.name}: {cmdline[:120]}")
    return left


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = LIMIT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, f"the holder ended early ({proc.returncode}): {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"{path} not written in {timeout}s")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """One 2-node cluster for the read-only checks; down (and nothing left) at the end of the module."""
    cl = _new(tmp_path_factory.mktemp("cluster"), "two")
    with cl:
        rec = cl.to_json()
        yield cl
    assert leftovers(rec) == []


# --- what a node has ---------------------------------------------------------------------------------


def test_each_node_has_its_hostname_address_and_hosts_file(two):
    addresses = [node.address for node in two.nodes]
    assert len(set(addresses)) == 2 and all(a.startswith("198.1") for a in addresses)
    for node in two.nodes:
        out = _sh(two, node.name, "cat /proc/sys/kernel/hostname; ip -4 -o addr show; echo RAY=$RAY_TMPDIR")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == node.name
        ifaces = {line.split()[1]: line.split()[3] for line in lines if " inet " in line}
        assert ifaces == {"lo": "127.0.0.1/8", "eth0": f"{node.address}/24"}
        assert f"RAY={two.ray_tmpdir}" in lines
    own = f"{PY} -I -S -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'"
    other = _sh(two, "node2", f"getent hosts node1; {own}")
    assert other.stdout.split() == [two.address("node1"), "node1", two.address("node2")], other.stdout


def test_tcp_from_node2_to_node1_and_no_path_from_the_root_namespace(two):
    server = two.popen(
        "node1",
        [PY, "-I", "-S", "-c", (
            "import socket, sys\n"
            f"s = socket.create_server(('{two.address('node1')}', 0)); s.settimeout(20)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "c, peer = s.accept(); c.sendall(('from ' + peer[0]).encode()); c.close()\n"
        )],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        port = int(server.stdout.readline())
        client = two.run(
            "node2",
            [PY, "-I", "-S", "-c",
             f"import socket; print(socket.create_connection(('node1', {port}), 5).recv(64).decode())"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == f"from {two.address('node2')}"
        assert server.wait(timeout=20) == 0
    finally:
        server.kill()
        server.wait()
    # the root namespace: the bridge has no address (IPv4 or IPv6) and no route names it (checked, not probed:
    # nothing is sent from the root namespace)
    assert (
        subprocess.run(["ip", "-o", "addr", "show", "dev", two.bridge], capture_output=True, text=True).stdout
        == ""
    )
    assert (
        subprocess.run(["ip", "route", "show", "dev", two.bridge], capture_output=True, text=True).stdout
        == ""
    )
    assert Path(f"/proc/sys/net/ipv6/conf/{two.bridge}/disable_ipv6").read_text().strip() == "1"
    routes = _sh(two, "node1", "ip route; ip -6 -o addr show dev eth0").stdout
    assert "default" not in routes and "inet6" not in routes, routes


def test_shared_folder_is_one_local_and_ray_folders_are_per_node(two):
    write = _sh(
        two, "node1",
        f"echo one > {two.shared}/s && echo one > {two.local}/l && echo one > {two.ray_dir}/r"
        f" && ls {two.root}/nodes | wc -l",
    )  # fmt: skip
    assert write.returncode == 0, write.stderr
    assert write.stdout.strip() == "0"  # a node sees no other node's folders
    read = _sh(two, "node2", f"cat {two.shared}/s; ls -A {two.local} | wc -l; ls -A {two.ray_dir} | wc -l")
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == ["one", "0", "0"]  # the shared file yes; node1's local and Ray files no
    assert (two.shared / "s").read_text() == "one\n"  # the host sees the shared folder at the same path
    assert (two.node("node1").local / "l").read_text() == "one\n"
    assert not (two.node("node2").local / "l").exists() and not (two.ray_dir / "r").exists()


def test_a_process_of_node1_is_not_visible_from_node2(two):
    sleeper = two.popen("node1", ["sleep", "61.25"])
    try:
        deadline = time.monotonic() + LIMIT_S
        while True:
            seen = _sh(two, "node1", "pgrep -x -f 'sleep 61.25'")
            if seen.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert seen.returncode == 0, "the sleeper is not visible in its own node"
        assert int(seen.stdout.split()[0]) < 100  # a pid of the node's own PID namespace
        assert _sh(two, "node2", "pgrep -x -f 'sleep 61.25'").returncode == 1
        assert _sh(two, "node1", f"kill {seen.stdout.split()[0]}").returncode == 0
        assert sleeper.wait(timeout=20) != 0
    finally:
        sleeper.kill()
        sleeper.wait()


# --- teardown ----------------------------------------------------------------------------------------


def test_down_leaves_nothing(tmp_path):
    cl = _new(tmp_path, "down")
    cl.up()
    rec = cl.to_json()
    assert all(node.alive() for node in cl.nodes)
    there = leftovers(rec)  # while up, leftovers() sees every kind of thing it looks for
    assert (
        "state file" in there
        and f"link {cl.bridge}" in there
        and f"mount of {rec['nodes'][0]['netns']}" in there
    )
    for node in rec["nodes"]:
        assert {
            f"netns {node['netns']}",
            f"link {node['link']}",
            f"{node['name']} pid {node['init_pid']}",
        } <= set(there)
    assert any(item.startswith("process ") for item in there)
    cl.down()
    assert leftovers(rec) == []
    assert cl.timings["up_s"] < LIMIT_S and cl.timings["down_s"] < LIMIT_S
    print(f"2 nodes: up {cl.timings['up_s']:.2f}s, down {cl.timings['down_s']:.2f}s")
    assert (cl.shared).is_dir() and not (cl.root / "nodes").exists()  # the shared folder stays


def test_an_exception_in_the_with_block_tears_down(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with _new(tmp_path, "exc") as cl:
            rec = cl.to_json()
            raise RuntimeError("boom")
    assert leftovers(rec) == []


def _holder(tmp_path: Path, tag: str) -> tuple[subprocess.Popen, Path, Path]:
    """`cluster run` holding a 2-node cluster for a host command that writes its pid and sleeps."""
    marker = tmp_path / f"{tag}.pid"
    (tmp_path / "rt").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [*TOOL, "run", "--nodes", "2", "--name", _name(tag), "--root", str(tmp_path / tag),
         "--ray-tmpdir", str(tmp_path / "rt"), "--grace", "5",
         "--", "sh", "-c",
         f'echo "$$ $ASCEND_RL_CLUSTER" > {marker}.tmp && mv {marker}.tmp {marker} && exec sleep 60'],
        cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # SIGINT as a terminal's Ctrl-C delivers it: a process that starts with SIGINT ignored keeps it ignored
        # (Python installs no KeyboardInterrupt then), and a pytest worker may have it ignored; a fresh CI run's
        # holder slept its 60 s through the test's SIGINT and exited 0
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    return proc, marker, lib.state_file(_name(tag))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_holder_tears_down(tmp_path, signum):
    proc, marker, state = _holder(tmp_path, f"sig{int(signum)}")
    try:
        pid, name = _wait_file(marker, proc).split()
        assert name == _name(f"sig{int(signum)}")
        rec = json.loads(state.read_text())
        assert rec["phase"] == "up" and rec["holder"] == proc.pid
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=LIMIT_S)
    finally:
        proc.kill()
        if proc.wait() < 0 and state.exists():  # killed here, so it could not tear down: do it, then fail
            subprocess.run([*TOOL, "down", "--name", _name(f"sig{int(signum)}")], cwd=REPO, env=child_env())
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1].startswith("cluster: "), err
    assert lib.start_time(int(pid)) is None  # the command it held the cluster for ended too
    assert leftovers(rec) == []


def test_sigterm_to_a_python_holder_tears_down(tmp_path):
    marker = tmp_path / "api.up"
    (tmp_path / "rt").mkdir()
    script = (
        "import sys, time\n"
        "from ascend_rl.harness.sim_cluster import Cluster\n"
        f"with Cluster({_name('api')!r}, 2, root={str(tmp_path / 'api')!r},\n"
        f"             ray_tmpdir={str(tmp_path / 'rt')!r}) as c:\n"
        f"    open({str(marker)!r} + '.tmp', 'w').write('up')\n"
        f"    __import__('os').rename({str(marker)!r} + '.tmp', {str(marker)!r})\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([PY, "-c", script], cwd=REPO, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        _wait_file(marker, proc)
        rec = json.loads(lib.state_file(_name("api")).read_text())
        proc.terminate()
        _, err = proc.communicate(timeout=LIMIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert leftovers(rec) == []


def test_sigkill_of_the_holder_then_down_from_another_process(tmp_path):
    proc, marker, state = _holder(tmp_path, "kill9")
    try:
        pid = int(_wait_file(marker, proc).split()[0])
        rec = json.loads(state.read_text())
        proc.kill()
        proc.wait(timeout=LIMIT_S)
    finally:
        proc.kill()
        if lib.start_time(pid) is not None:
            os.kill(pid, signal.SIGKILL)  # the host command it held the cluster for (ours)
    status = _tool("status", "--name", rec["name"])
    assert status.returncode == 0, status.stderr
    assert "2/2 nodes alive" in status.stdout and f"held by pid {proc.pid} (gone)" in status.stdout, (
        status.stdout
    )
    assert len(leftovers(rec)) > 0  # the nodes outlived their holder
    down = _tool("down", "--name", rec["name"])
    assert down.returncode == 0, down.stderr
    assert leftovers(rec) == []


# --- the command line ---------------------------------------------------------------------------------


def test_cli_up_exec_status_kill_revive_down(tmp_path):
    name, root = _name("cli"), tmp_path / "cli"
    (tmp_path / "rt").mkdir()
    up = _tool(
        "up", "--nodes", "3", "--name", name, "--root", str(root), "--ray-tmpdir", str(tmp_path / "rt")
    )
    assert up.returncode == 0, up.stderr
    rec = json.loads(lib.state_file(name).read_text())
    try:
        assert up.stdout.startswith(f"cluster {name} up: 3 nodes in "), up.stdout
        again = _tool("up", "--nodes", "2", "--name", name, "--root", str(tmp_path / "again"))
        assert again.returncode == 1 and len(again.stderr.splitlines()) == 1, again.stderr
        assert "exists" in again.stderr
        node3 = rec["nodes"][2]["address"]
        assert _tool("exec", "--name", name, node3, "--", "hostname").stdout == "node3\n"
        rc = _tool("exec", "--name", name, "2", "--", "sh", "-c", "exit 7")
        assert rc.returncode == 7, rc.stderr
        assert _tool("exec", "--name", name, "--wd", "/", "node1", "--", "pwd").stdout == "/\n"
        status = _tool("status", "--name", name)
        assert status.returncode == 0 and "3/3 nodes alive" in status.stdout, status.stdout
        assert len(json.loads(_tool("status", "--name", name, "--json").stdout)["nodes"]) == 3

        killed = _tool("kill", "--name", name, "node2")
        assert killed.returncode == 0, killed.stderr
        status = _tool("status", "--name", name).stdout
        assert (
            "2/3 nodes alive" in status
            and "DEAD" in status
            and f"link {rec['nodes'][1]['link']} (down)" in status
        )
        dead = _tool("exec", "--name", name, "node2", "--", "true")
        assert dead.returncode == 1 and "not running" in dead.stderr and len(dead.stderr.splitlines()) == 1
        revived = _tool("revive", "--name", name, "node2")
        assert revived.returncode == 0, revived.stderr
        assert _tool("exec", "--name", name, "node2", "--", "hostname").stdout == "node2\n"
        rec = json.loads(lib.state_file(name).read_text())
    finally:
        down = _tool("down", "--name", name, "--purge")
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith(f"cluster {name} down in "), down.stdout
    assert leftovers(rec) == [] and not root.exists()


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["up", "--nodes", "0", "--name", "x"], 2, "node count"),
        (["up", "--nodes", "65", "--name", "x"], 2, "node count"),
        (["up", "--nodes", "2", "--name", "Bad_Name"], 2, "cluster name"),
        (["exec", "--name", "no-such-cluster", "node1", "--", "true"], 1, "no cluster named"),
        (["status", "--name", "no-such-cluster"], 1, "no cluster named"),
        (["down", "--name", "no-such-cluster"], 1, "no cluster named"),
        (["down"], 2, "--name"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_refusals_are_one_line(args, code, says, capsys, monkeypatch):
    monkeypatch.delenv("ASCEND_RL_CLUSTER", raising=False)
    assert cli.main(args) == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err and err.startswith("cluster: error: "), err


def test_unknown_node_and_missing_command(two, capsys):
    assert cli.main(["exec", "--name", two.name, "node9", "--", "true"]) == 2
    assert cli.main(["exec", "--name", two.name, "node1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no node 'node9'" in err[0] and "no command" in err[1], err


def test_without_root_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err, err
    with pytest.raises(lib.Unsupported, match="needs root"):
        lib.Cluster("x", 1).up()


@pytest.mark.parametrize("verb", ["up", "run", "exec", "status", "down", "kill", "revive"])
def test_each_verb_has_help(verb, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([verb, "--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage: ")


def test_two_clusters_coexist_and_cannot_reach_each_other(tmp_path, two):
    with _new(tmp_path, "other") as other:
        assert other.slot != two.slot and other.bridge != two.bridge and other.subnet != two.subnet
        assert _sh(other, "node1", "hostname").stdout == "node1\n"
        assert _sh(two, "node1", "hostname").stdout == "node1\n"
        # another cluster's subnet has no route from this one: refused at once, nothing is sent
        probe = other.run(
            "node1",
            [PY, "-I", "-S", "-c",
             f"import socket\ntry:\n    socket.create_connection(('{two.address('node1')}', 9), 2)\n"
             "except OSError as e:\n    print(e.errno)"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert probe.stdout.strip() == "101", probe  # ENETUNREACH
        rec = other.to_json()
    assert leftovers(rec) == []
    assert all(node.alive() for node in two.nodes)  # the first cluster is untouched


def test_a_killed_node_goes_silent_and_revives(tmp_path):
    with _new(tmp_path, "lost") as cl:
        server = cl.popen(
            "node2",
            [PY, "-I", "-S", "-c", (
                "import socket, time\n"
                "s = socket.create_server(('', 0)); print(s.getsockname()[1], flush=True)\n"
                "c, _ = s.accept(); time.sleep(60)\n"
            )],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        port = int(server.stdout.readline())
        client = cl.popen(
            "node1",
            [PY, "-I", "-S", "-c", (
                "import socket, sys\n"
                f"c = socket.create_connection(('node2', {port}), 5); print('connected', flush=True)\n"
                "sys.stdin.readline(); c.settimeout(1.5)\n"
                "try:\n    print('got', c.recv(1) or 'EOF')\nexcept TimeoutError:\n    print('silence')\n"
            )],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert client.stdout.readline() == "connected\n"
            cl.kill("node2")  # link down, then the PID namespace: no FIN or RST reaches node1
            assert server.wait(timeout=LIMIT_S) != 0
            out, _ = client.communicate("go\n", timeout=LIMIT_S)
            assert out == "silence\n", out
            assert cl.status()["nodes"][1]["alive"] is False and "killed by" in cl.node("node2").lost
            cl.revive("node2")
            back = _sh(cl, "node2", "hostname; ip -4 -o addr show dev eth0").stdout.split()
            assert back[0] == "node2" and f"{cl.address('node2')}/24" in back, back
        finally:
            for proc in (server, client):
                proc.kill()
                proc.wait()
