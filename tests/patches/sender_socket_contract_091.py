"""verl 0.9.1's BucketedWeightSender over a socket that only has send_pyobj and recv (the driver of
test_upstream_checks_091.py; run in verl 0.9.1's e2e environment with the tree first on PYTHONPATH).

The sender is built as 0.9.1 builds it (no receiver to watch), its socket and bucket replaced as verl's own
test_sender_accepts_strided_tensor replaces them, and sends one strided weight. Prints one JSON line: the error
(empty when none), each message's weight names and is_last, and whether the bucket holds the weight's bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path


class SendRecvSocket:
    """A socket with only what the sender uses of it upstream: send_pyobj and recv (the REQ side)."""

    def __init__(self):
        self.messages = []

    def send_pyobj(self, message):
        self.messages.append(message)

    def recv(self):
        return b""


class NoDevice:
    """No accelerator to synchronize."""

    @staticmethod
    def synchronize():
        pass


def sender_module():
    """verl's bucketed_weight_transfer.py, loaded by its path: its package's __init__ imports the vLLM rollout
    (vLLM, a minute on 2 cores); the file itself needs only torch, pyzmq and verl.utils.device."""
    import verl

    name = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
    path = Path(verl.__file__).parent / "workers/rollout/vllm_rollout/bucketed_weight_transfer.py"
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description="verl 0.9.1's weight sender over a send/recv-only socket.")
    parser.add_argument(
        "--tree", type=Path, required=True, help="verl 0.9.1 tree containing verl/ (on PYTHONPATH)"
    )
    parser.parse_args()

    import torch

    bwt = sender_module()
    weight = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)[:, 0, :]  # strided: no byte view of it
    assert not weight.is_contiguous()
    buffer = torch.zeros(weight.nbytes, dtype=torch.uint8)
    socket = SendRecvSocket()
    sender = bwt.BucketedWeightSender(
        zmq_handle="ipc:///tmp/recipes-unused.sock", bucket_size_mb=1, use_shm=True
    )
    sender._init_socket = lambda: setattr(sender, "socket", socket)
    sender._init_buffer = lambda: setattr(sender, "buffer", buffer)
    sender._cleanup = lambda: None
    bwt.get_torch_device = NoDevice
    error = ""
    try:
        asyncio.run(sender.async_send_weights(iter([("strided", weight)])))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    result = {
        "error": error,
        "messages": [{"names": sorted(m["bucket_meta"]), "is_last": m["is_last"]} for m in socket.messages],
        "equal": bool(torch.equal(buffer.view(dtype=weight.dtype).view(weight.shape), weight)),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
