"""The CPU proof harness: tiny models, the problems, the warm start, make e2e, make demo, the fault runs and the
simulated cluster's runs."""
