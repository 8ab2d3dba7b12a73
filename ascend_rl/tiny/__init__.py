"""The CPU stand-ins for the recipes' real models and data: a tiny Qwen2 and a tiny DeepSeek-V3, the bundled problems.

The harness (make e2e, make demo, the fault runs) and the recipes' CPU checks (llm_rl/deepseek_r1/check_*.py) both
build on these; nothing here imports the harness.
"""
