"""shared-0018 on verl 0.9.1: a weight sync whose receiving side has failed ends instead of hanging.

verl 0.9.1's own BucketedWeightSender (the trainer's side of ServerAdapter.update_weights), run as a script in a
subprocess on the patched Qwen 0.9.1 tree over its real ZMQ socket and shared-memory bucket, with no engine
listening: the engine's call (the future ServerAdapter now hands over) has raised, or has returned before taking
every bucket. The sender must raise the engine's error, or say the receiver returned early, within seconds. The
control, the same sender without that future (as 0.9.1 builds it), is still blocked on its socket. A CPU machine
has no accelerator to collect IPC handles for: the script answers is_support_ipc as verl's CPU runs do (False).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

from patched_tree import patched_copy, run_on_tree

BASE = "0.9.1"


@pytest.fixture(scope="module")
def measured(tmp_path_factory, pristine_base) -> dict:
    from ascend_rl import manifest

    tree = tmp_path_factory.mktemp("recv091") / "verl-tree"
    patched_copy(pristine_base(BASE), tree, manifest.load_recipe("qwen2_5", BASE))
    result = run_on_tree(__file__, tree, timeout=300)
    print("weight sync with a failed receiver (verl 0.9.1):", json.dumps(result, indent=1))
    return result


@pytest.mark.slow
def test_a_receiver_that_raised_ends_the_sync_with_its_error(measured):
    raised = measured["raised"]
    assert (
        raised["error"] == "ValueError: the engine's update_weights_from_ipc failed" and raised["seconds"] < 5
    )


@pytest.mark.slow
def test_a_receiver_that_returned_early_ends_the_sync(measured):
    early = measured["returned_early"]
    assert early["error"].startswith("RuntimeError: weight sync: the rollout's receiver returned before")
    assert 1.5 <= early["seconds"] < 8  # after the grace for a reply still in flight


@pytest.mark.slow
def test_without_the_receivers_future_the_sender_still_waits(measured):
    assert measured["without_future"] == {"blocked_after_s": 3}


# --------------------------------------------------------------------------- subprocess side


def _module():
    """verl's bucketed_weight_transfer.py, loaded by its path: its package's __init__ imports the vLLM rollout,
    which needs vLLM installed; the file itself needs only torch, pyzmq and verl.utils.device."""
    import importlib.util
    import sys

    name = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
    if name not in sys.modules:
        import verl

        path = Path(verl.__file__).parent / "workers/rollout/vllm_rollout/bucketed_weight_transfer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _send(receiver_done, grace_ms: int | None = None, bound_s: float = 30) -> dict:
    import asyncio
    import concurrent.futures
    import threading
    import uuid

    import torch

    sender = _module().BucketedWeightSender(
        zmq_handle=f"ipc:///tmp/recipes-recv-{uuid.uuid4().hex}.sock",
        bucket_size_mb=1,
        use_shm=True,
        **({} if receiver_done is None else {"receiver_done": receiver_done}),
    )
    if grace_ms is not None:
        sender.GRACE_MS = grace_ms
    outcome: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        start = time.monotonic()
        try:
            asyncio.run(sender.async_send_weights(iter([("w", torch.ones(4))])))
            outcome.set_result({"error": "", "seconds": round(time.monotonic() - start, 1)})
        except Exception as exc:
            outcome.set_result(
                {"error": f"{type(exc).__name__}: {exc}", "seconds": round(time.monotonic() - start, 1)}
            )

    threading.Thread(target=run, daemon=True).start()
    try:
        return outcome.result(timeout=bound_s)
    except concurrent.futures.TimeoutError:
        return {"blocked_after_s": int(bound_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description="verl 0.9.1's weight sender with a failed receiver (CPU).")
    parser.add_argument("--tree", type=Path, required=True, help="patched verl 0.9.1 tree containing verl/")
    args = parser.parse_args()

    import concurrent.futures

    bwt = _module()
    bwt.is_support_ipc = lambda: (
        False
    )  # no accelerator here: nothing to collect (verl's CPU platform says so)
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(ValueError("the engine's update_weights_from_ipc failed"))
    returned: concurrent.futures.Future = concurrent.futures.Future()
    returned.set_result(None)
    _send(
        failed
    )  # a first sync pays one-time costs (zmq's context, shared memory, the event loop): not timed
    result = {
        "tree": str(args.tree),
        "verl_file": bwt.__file__,
        "raised": _send(failed),
        "returned_early": _send(returned, grace_ms=1500),
        "without_future": _send(None, bound_s=3),
    }
    print(json.dumps(result), flush=True)
    os._exit(0)  # the control's sender thread is still blocked on its socket, by design


if __name__ == "__main__":
    main()
