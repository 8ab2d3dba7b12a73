"""Whether this machine can hold a simulated cluster (root and `ip netns`), for the tests that bring one up."""

from __future__ import annotations

import pytest

from ascend_rl.harness import sim_cluster as lib

try:
    lib.check_support()
    NO_CLUSTER = ""  # why a cluster cannot be made here; empty when it can
except lib.Unsupported as exc:
    NO_CLUSTER = f"needs root and `ip netns`: {exc}"
needs_cluster = pytest.mark.skipif(bool(NO_CLUSTER), reason=NO_CLUSTER)
