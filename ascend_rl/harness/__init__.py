"""The CPU proof harness: tiny models, the problems, the warm start, make e2e, make demo, the fault runs, measured
runs (runner.py), the bases benchmark and the SIMULATED cluster (sim_cluster/) with its runs."""
