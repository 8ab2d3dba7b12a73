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
"""Shape of the rollout device mesh, i.e. how the generation batch is split over the rollout ranks; pure."""


def rollout_mesh_shape(
    world_size: int, tp_size: int, dp_size: int, pp_size: int, split_dp: bool
) -> tuple[int, int, int]:
    """(dp, infer_tp, infer_pp) of verl's rollout device mesh; dp is the number of batch chunks the rollout gets.

    verl 0.6.0 folds the vLLM DP ranks into infer_tp, so every DP rank of a vLLM DP group receives, and generates,
    the same chunk. With split_dp each engine (tp_size consecutive ranks, one vLLM DP rank) is a mesh dp rank of
    its own and gets its own equal-size chunk; verl collects one output per engine in rank order, which is the
    chunk order. The ranks of a vLLM DP group stay one consecutive block of tp_size * dp_size ranks.
    """
    if min(tp_size, dp_size, pp_size) < 1 or world_size % (tp_size * dp_size * pp_size):
        raise ValueError(
            f"world size {world_size} is not a multiple of rollout tp {tp_size} x dp {dp_size} x pp {pp_size}; "
            "set actor_rollout_ref.rollout.tensor_model_parallel_size/data_parallel_size so it divides"
        )
    infer_tp = tp_size if split_dp else tp_size * dp_size
    return world_size // (infer_tp * pp_size), infer_tp, pp_size
