"""The CPU proof harness: make e2e, make demo, the fault runs, measured runs (runner.py), the bases benchmark and
the SIMULATED cluster (sim_cluster/) with its runs (the tiny models and the problems they train on: ascend_rl/tiny/)."""
