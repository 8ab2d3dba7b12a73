"""Test hook: every process of a run says which node it landed on and which cluster settings reached it.

With RECIPES_RANK_EVIDENCE=<file> (the multi-node e2e runs set it, and hand it to the Ray workers through the
job's runtime_env), a process appends one JSON line to <file> when it
- initialises torch.distributed (a trainer rank: `caller` is the verl module that called init_process_group;
  a vLLM engine's own group: a vllm module): its rank, world size, backend, MASTER_ADDR / MASTER_PORT or the
  init method, and the TCP connections and listening sockets the call opened (which addresses the group
  really uses);
- builds a vLLM engine core: the engine's data-parallel settings (size, master address and ports), which decide
  whether its DP group would cross the nodes;
- (verl 0.7.1) launches a vLLM server: the address it serves on and the master address / ports it hands vLLM's
  DP launch.
Each line also carries where the process runs: its host name, its Ray node's address, the socket interface
variables (GLOO / HCCL / TP_SOCKET_IFNAME) and the IPv4 address of the interface they name. The harness
(ascend_rl/harness/multinode.py) reads the file back; these are facts the process saw, not the launcher's
intentions. Everything here is best effort: a failure to record is recorded, never raised into the run.
"""

import os
import socket
import sys

from recipes_hook_util import PatchAfterLoad
from recipes_hook_util import install as patch_after_load
from recipes_shm_record import append_json_line  # ascend_rl/shm_record/, beside these hooks on PYTHONPATH

ENV = "RECIPES_RANK_EVIDENCE"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
DP_ENV = ("VLLM_HOST_IP", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_DP_SIZE", "VLLM_DP_RANK")
PARALLEL_FIELDS = (
    "data_parallel_size",
    "data_parallel_size_local",
    "data_parallel_rank",
    "data_parallel_master_ip",
    "data_parallel_master_port",
    "data_parallel_rpc_port",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "enable_expert_parallel",
    "distributed_executor_backend",
    "master_addr",
    "master_port",
    "nnodes",
    "node_rank",
)
SERVER_FIELDS = (
    "_server_address",
    "_master_address",
    "_master_port",
    "_dp_rpc_port",
    "_dp_master_port",
    "replica_rank",
    "node_rank",
    "nnodes",
)


def _ifname_ipv4(ifname):
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def _where():
    """Where this process runs, as it sees it."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    where = {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "ifname": {var: os.environ.get(var) for var in IFNAME_VARS},
        "ifname_addr": None,
        "ray_node_ip": None,
    }
    if ifname:
        try:
            where["ifname_addr"] = _ifname_ipv4(ifname)
        except OSError as exc:
            where["ifname_addr"] = f"error: {exc.strerror}"
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                where["ray_node_ip"] = ray.util.get_node_ip_address()
        except Exception as exc:  # noqa: BLE001 (evidence only; never break the run)
            where["ray_node_ip"] = f"error: {exc}"
    return where


def _write(record):
    path = os.environ.get(ENV)
    if not path:
        return
    append_json_line(path, record, 0o666)


def _sockets():
    """This process's TCP sockets: established ones as (local ip, local port, remote ip, remote port), and the
    (ip, port) pairs it listens on."""
    try:
        import psutil

        proc = psutil.Process()
        conns = proc.net_connections("tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
    except Exception:  # noqa: BLE001
        return set(), set()
    plain = lambda ip: ip.removeprefix("::ffff:")  # noqa: E731
    established = {
        (plain(c.laddr.ip), c.laddr.port, plain(c.raddr.ip), c.raddr.port)
        for c in conns
        if c.status == "ESTABLISHED" and c.raddr
    }
    listening = {(plain(c.laddr.ip), c.laddr.port) for c in conns if c.status == "LISTEN"}
    return established, listening


def _wrap_init_process_group(init):
    def init_process_group(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "?")
        before, listened = _sockets()
        result = init(*args, **kwargs)
        after, listening = _sockets()
        try:
            import torch.distributed as dist

            record = {
                "kind": "torch.distributed",
                "caller": caller,
                "rank": dist.get_rank(),
                "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend()),
                "master_addr": os.environ.get("MASTER_ADDR"),
                "master_port": os.environ.get("MASTER_PORT"),
                "init_method": kwargs.get("init_method") or (args[1] if len(args) > 1 else None),
                # what the call opened (other threads of the process may open sockets meanwhile: the harness
                # keeps those that meet the master's port or a port some rank's group listens on)
                "tcp": sorted(after - before),
                "listen": sorted(listening - listened),
            }
        except Exception as exc:  # noqa: BLE001
            record = {"kind": "torch.distributed", "caller": caller, "error": repr(exc)}
        _write({**record, **_where()})
        return result

    init_process_group.__wrapped__ = init
    return init_process_group


def _patch_torch_distributed(module):
    wrapped = _wrap_init_process_group(module.init_process_group)
    module.init_process_group = wrapped
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None:
        c10d.init_process_group = wrapped


def _patch_engine_core(module):
    cls = module.EngineCore
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        config = kwargs.get("vllm_config", args[0] if args else None)
        try:
            parallel = config.parallel_config
            record = {
                "kind": "vllm.engine",
                "parallel": {key: getattr(parallel, key, None) for key in PARALLEL_FIELDS},
                "env": {key: os.environ.get(key) for key in DP_ENV},
            }
        except Exception as exc:  # noqa: BLE001
            record = {"kind": "vllm.engine", "error": repr(exc)}
        _write({**record, **_where()})
        init(self, *args, **kwargs)

    cls.__init__ = __init__


def _patch_http_server(module):
    cls = getattr(module, "vLLMHttpServer", None)
    if cls is None or not hasattr(cls, "launch_server"):
        return
    launch = cls.launch_server

    async def launch_server(self, *args, **kwargs):
        names = ("master_address", "master_port", "dp_rpc_port")
        given = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
        try:
            record = {
                "kind": "vllm.server",
                "server": {key.lstrip("_"): getattr(self, key, None) for key in SERVER_FIELDS},
                "given": given,
                "rollout": {
                    key: self.config.get(key)
                    for key in ("tensor_model_parallel_size", "data_parallel_size", "expert_parallel_size")
                },
            }
        except Exception as exc:  # noqa: BLE001
            record = {"kind": "vllm.server", "error": repr(exc)}
        _write({**record, **_where()})
        return await launch(self, *args, **kwargs)

    cls.launch_server = launch_server


TARGETS = {
    "torch.distributed": _patch_torch_distributed,
    "vllm.v1.engine.core": _patch_engine_core,
    "verl.workers.rollout.vllm_rollout.vllm_async_server": _patch_http_server,  # verl 0.7.1's server
}


def _hook_error(module, exc):
    _write({"kind": "hook-error", "module": module.__name__, "error": repr(exc), **_where()})


def install() -> None:
    """Patch the target modules as they are imported (only when RECIPES_RANK_EVIDENCE names a file)."""
    if os.environ.get(ENV) and not any(
        isinstance(f, PatchAfterLoad) and f.targets is TARGETS for f in sys.meta_path
    ):
        patch_after_load(TARGETS, _hook_error)


install()  # sitecustomize imports this module in every process; it patches only when the variable is set
