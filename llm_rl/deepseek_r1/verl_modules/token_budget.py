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
"""The scheduler token budget vLLM 0.13 accepts (SchedulerConfig.verify_max_model_len); pure, no vllm import."""


def token_budget_problem(
    max_num_batched_tokens: int, max_model_len: int, enable_chunked_prefill: bool, max_num_seqs: int
) -> str | None:
    """Why vLLM 0.13 would refuse this budget, or None when it accepts it.

    With chunked prefill a prompt longer than max_num_batched_tokens is prefilled over several steps, so the budget
    may be below max_model_len; without it the budget must hold a whole sequence. Every step must fit one token of
    each running sequence.
    """
    if max_num_batched_tokens < max_model_len and not enable_chunked_prefill:
        return (
            f"max_num_batched_tokens ({max_num_batched_tokens}) < max_model_len ({max_model_len}) needs "
            "enable_chunked_prefill=True; set actor_rollout_ref.rollout.enable_chunked_prefill=True or raise "
            "actor_rollout_ref.rollout.max_num_batched_tokens"
        )
    if max_num_batched_tokens < max_num_seqs:
        return (
            f"max_num_batched_tokens ({max_num_batched_tokens}) < max_num_seqs ({max_num_seqs}); raise "
            "actor_rollout_ref.rollout.max_num_batched_tokens or lower actor_rollout_ref.rollout.max_num_seqs"
        )
    return None
