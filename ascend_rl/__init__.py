"""The recipes' library: the manifest, the patch overlay, artifacts, data preparation, the preflight,
the patch documentation checks, measured launches and the CPU proof harness.

Commands: ``python3 -m ascend_rl --help`` from the repository root (or ``ascend-rl`` after
``pip install -e .``) lists them.
"""
