"""DeepSeek-R1 GRPO on an A3 cluster: the recipe folder (its tools run as python3 -m llm_rl.deepseek_r1.<tool>)."""
