"""Helpers of the demos (scripts/demo_learn.py, scripts/demo_grpo.py): the tiny model, the tasks, verl in-process, the report."""
