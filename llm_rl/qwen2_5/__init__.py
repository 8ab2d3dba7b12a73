"""Qwen2.5-1.5B GRPO on MATH: the recipe folder (its tools run as python3 -m llm_rl.qwen2_5.<tool>)."""
