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
"""vLLM data-parallel environment (VLLM_DP_*) for one rank of an SPMD rollout; pure, no side effects."""

from collections.abc import Mapping, Sequence

DEFAULT_BASE_PORT = 31000
# vLLM takes consecutive ports from its DP master port, one per DP process group it creates.
PORT_STRIDE = 16


def vllm_dp_env(
    rank: int,
    world_size: int,
    local_world_size: int,
    tp_size: int,
    dp_size: int,
    node_ips: Sequence[str],
    env: Mapping[str, str],
) -> dict[str, str]:
    """VLLM_DP_* variables for `rank`: DP rank/size of its DP group, and that group's own master address and port.

    Ranks are laid out as verl's rollout mesh: consecutive blocks of tp_size * dp_size ranks form one DP group
    (one vLLM engine per tp_size ranks). node_ips[r] is the address of rank r's node. VLLM_DP_MASTER_IP in env
    overrides the master address; VLLM_DP_MASTER_PORT in env is the base port (group g gets base + g * stride).
    """
    group_size = tp_size * dp_size
    if min(tp_size, dp_size, local_world_size) < 1 or world_size % group_size:
        raise ValueError(
            f"world size {world_size} is not a multiple of rollout tp {tp_size} x dp {dp_size}; "
            "set actor_rollout_ref.rollout.tensor_model_parallel_size/data_parallel_size so it divides"
        )
    if not 0 <= rank < world_size or len(node_ips) != world_size:
        raise ValueError(f"rank {rank} / {len(node_ips)} node addresses do not match world size {world_size}")
    group, offset = divmod(rank, group_size)
    first = group * group_size
    first_on_my_node = max(first, rank - rank % local_world_size)
    base_port = int(env.get("VLLM_DP_MASTER_PORT") or DEFAULT_BASE_PORT)
    port = base_port + group * PORT_STRIDE
    if port > 65535:
        raise ValueError(
            f"VLLM_DP_MASTER_PORT {base_port} leaves no room for {world_size // group_size} DP groups"
        )
    return {
        "VLLM_DP_RANK": str(offset // tp_size),
        "VLLM_DP_RANK_LOCAL": str((rank - first_on_my_node) // tp_size),
        "VLLM_DP_SIZE": str(dp_size),
        "VLLM_DP_MASTER_IP": env.get("VLLM_DP_MASTER_IP") or node_ips[first],
        "VLLM_DP_MASTER_PORT": str(port),
    }
