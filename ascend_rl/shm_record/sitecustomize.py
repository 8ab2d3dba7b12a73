"""The launchers' /dev/shm record (issue 48, item 6): on PYTHONPATH for a real launch, it makes every Python process
of the run (the driver, Ray's workers, vLLM's engine) append each POSIX shared-memory segment and named semaphore it
creates to $RECIPES_SHM_RECORD as it creates it, through the hook beside it in this folder (recipes_shm_record.py,
which the harness's test hooks import too). The next launch on the node removes what such a run left when it was
killed, by these names only (`python3 -m ascend_rl shm clean`).

A "{host}" in $RECIPES_SHM_RECORD becomes this node's host name, so nodes that share a folder keep apart records.
The sitecustomize this one shadows (a distribution's, a virtual environment's) is run after it.
"""

import os
import socket
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _record() -> None:
    record = os.environ.get("RECIPES_SHM_RECORD", "")
    if "{host}" in record:
        record = record.replace("{host}", socket.gethostname())
        os.environ["RECIPES_SHM_RECORD"] = (
            record  # the hook reads it at import; children inherit the resolved path
        )
    if not record:
        return
    try:
        os.makedirs(os.path.dirname(record), exist_ok=True)
    except OSError:
        return
    try:
        import recipes_shm_record  # noqa: F401  (this folder's: records from here on; a failure never breaks the run)
    except Exception:  # noqa: BLE001
        pass


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one Python would have imported without this folder."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001  (as Python's own start-up: a failing sitecustomize does not stop the process)
        pass


_record()
_chain()
