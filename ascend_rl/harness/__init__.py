"""The CPU proof harness: tiny models, the problems, the warm start, verl in-process, the GRPO driver,
make e2e and make demo."""
