"""Helpers of scripts/demo_grpo.py: the tiny model, the bundled problems, verl in-process, the report."""
