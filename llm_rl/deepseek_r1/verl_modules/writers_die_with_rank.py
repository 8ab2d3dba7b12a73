# Copyright 2025 ascend-rl-recipes maintainers
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""A trainer rank's forked checkpoint writers die with it (patches ds-0011, ds-0111 and ds-0211, for verl 0.6.0, 0.7.1
and 0.9.1; each installs it as verl/utils/megatron/writers_die_with_rank.py and calls it from
verl/utils/megatron/dist_checkpointing.py).

megatron-core writes a distributed checkpoint from processes it forks from the trainer rank: the save's writers
(FileSystemWriterAsync.write_preloaded_data_multiproc, fork context, run in the rank itself by a synchronous save)
and, under async_save, the TemporalAsyncCaller that forks those writers in turn. A forked child inherits the rank's
connection to Ray's raylet, so when the rank dies in a save Ray does not see it die while the child lives, and the
other ranks wait in the save's collectives until their timeout.

install() registers an at-fork hook: every process forked from this one afterwards (os.fork, multiprocessing's fork
context, and their own forks in turn) asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), and
exits at once when the parent is already gone. Fork-then-exec launches (subprocess, multiprocessing's spawn and
forkserver contexts) run no at-fork hooks and are not affected. The kernel sends the signal when the *thread* that
forked the child ends, not only the process: a fork from a short-lived thread would be killed with that thread.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# the pid of the process about to fork (set in the parent before each fork, read in the child) and whether the
# hook is registered: os.register_at_fork cannot be undone, so install() registers it once per interpreter
_state = {"forking_pid": None, "installed": False}


def _note_forking_pid() -> None:
    _state["forking_pid"] = os.getpid()


def die_with_parent() -> bool:
    """In a child just forked: SIGKILL when the parent dies; exit at once if it has already died. False where the
    kernel offers no parent-death signal (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if _state["forking_pid"] is not None and os.getppid() != _state["forking_pid"]:
        os._exit(1)  # the parent died between the fork and prctl: no signal will come
    return True


def install() -> None:
    """From now on every process forked from this one dies with it (idempotent)."""
    if _state["installed"]:
        return
    os.register_at_fork(before=_note_forking_pid, after_in_child=die_with_parent)
    _state["installed"] = True


def installed() -> bool:
    """Whether this interpreter's forks die with it."""
    return _state["installed"]
