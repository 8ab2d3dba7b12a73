"""python3 -m ascend_rl TOOL [ARGS...]: run one of the repository's commands (from the repository root,
or anywhere once `pip install -e .` has installed the package)."""

import sys

# Before anything that needs 3.11 (tomllib, the syntax): one line saying what to run instead, not a traceback.
try:
    import tomllib  # noqa: F401
except ImportError:
    sys.exit(
        f"ascend_rl: error: Python {sys.version.split()[0]} ({sys.executable}) has no tomllib; the tool needs "
        "Python 3.11 or newer: run it with python3.11, or with .venv/bin/python (make setup)"
    )

import runpy  # noqa: E402

# Tool name -> (module, what it does). Each module's own `if __name__ == "__main__"` block is the command.
TOOLS = {
    "overlay": (
        "ascend_rl.cli.overlay",
        "fetch a recipe's pinned verl tree; apply, check or revert its patches",
    ),
    "resolve": (
        "ascend_rl.cli.resolve",
        "what a launch of a recipe on a verl base needs (tree, overrides, die), resolved once",
    ),
    "preflight": ("ascend_rl.cli.preflight", "check a launch before it starts: tree, config, paths, stack"),
    "plan_memory": (
        "ascend_rl.cli.plan_memory",
        "per-die memory of every phase of a GRPO step, from a launcher's dry-run plan",
    ),
    "patchdoc": (
        "ascend_rl.cli.patchdoc",
        "list, show and check the patch headers; regenerate the README tables",
    ),
    "stack": (
        "ascend_rl.cli.stack",
        "compare the installed Ascend stack with a verl base's constraints file (default: the default base's)",
    ),
    "compat": (
        "ascend_rl.cli.compat",
        "resolve every import of a verl tree against the pinned wheels",
    ),
    "ray_cluster": ("ascend_rl.cli.ray_cluster", "plan, start and wait for a real multi-node Ray cluster"),
    "prepare_math": (
        "ascend_rl.cli.prepare_math",
        "MATH-lighteval parquet -> the recipe's train/test parquet",
    ),
    "parquet2json": (
        "ascend_rl.cli.parquet2json",
        "MATH-lighteval parquet file(s) -> OpenCompass's math.json (keys <type>_<n>)",
    ),
    "tokenizer_config": (
        "ascend_rl.cli.tokenizer_config",
        "install the recipe's tokenizer_config.json into a model folder (backs up the original)",
    ),
    "evaluate": (
        "ascend_rl.cli.evaluate",
        "greedy accuracy of a model (or verl checkpoint) on a test parquet",
    ),
    "e2e": ("ascend_rl.harness.e2e", "the recipes' real launch paths on CPU (make e2e)"),
    "shm": ("ascend_rl.shm", "remove what killed launches left in this node's /dev/shm, by their record"),
    "run_failure": (
        "ascend_rl.run_failure",
        "one line on why a training run failed: what died, in which step",
    ),
    "shape_check": (
        "ascend_rl.harness.shape_check",
        "build every rank class of a launch's Megatron layout on this CPU; compare it with the memory plan",
    ),
    "faults": (
        "ascend_rl.harness.faults",
        "kill CPU training runs inside a checkpoint save; check the resume",
    ),
    "sim_cluster": (
        "ascend_rl.harness.sim_cluster",
        "a SIMULATED cluster: N nodes in Linux namespaces on this machine (root)",
    ),
    "cluster_faults": (
        "ascend_rl.harness.cluster_faults",
        "start-up faults on the simulated cluster: each one line, in bounded time",
    ),
    "demo": (
        "ascend_rl.harness.demo",
        "GRPO through the Qwen launcher on CPU: a tiny model learns (make demo)",
    ),
    "layout": (
        "ascend_rl.layout",
        "docs/layout.md's module list, generated from the tree (--check: is it current)",
    ),
    "bench_bases": (
        "ascend_rl.harness.bench_bases",
        "the same CPU run on each verl base, side by side: step time split, bytes per sync, memory",
    ),
    "make_problems": ("ascend_rl.harness.make_problems", "regenerate the bundled demo problems"),
}
# Old command names, each now its module's name: they still run, after a one-line notice (CHANGELOG.md).
RENAMED = {
    "check_stack": "stack",
    "check_imports": "compat",
    "install_tokenizer_config": "tokenizer_config",
    "cluster": "sim_cluster",
}
# Commands that are gone, with what to run instead (CHANGELOG.md says when).
GONE = {
    "demo_inprocess": "the in-process GRPO loop is gone; run `make demo` (python3 -m ascend_rl demo)",
}
RECIPE_TOOLS = (
    "llm_rl.qwen2_5.prepare_math500",
    "llm_rl.qwen2_5.bench_reward",
    "llm_rl.deepseek_r1.prepare_deepscaler",
    "llm_rl.deepseek_r1.derive_config",
    "llm_rl.deepseek_r1.bench_reshard",
    "llm_rl.deepseek_r1.check_rollout",
    "llm_rl.deepseek_r1.check_megatron",
)


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = ["usage: python3 -m ascend_rl TOOL [ARGS...]   (TOOL --help for its options)", "", "tools:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in TOOLS.items()]
    lines += ["", "recipe tools (python3 -m MODULE --help):"] + [f"  {m}" for m in RECIPE_TOOLS]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    tool, rest = argv[0], argv[1:]
    if tool in RENAMED:
        print(
            f"ascend_rl: '{tool}' is now '{RENAMED[tool]}' (its module's name); running it", file=sys.stderr
        )
        tool = RENAMED[tool]
    if tool in GONE:
        print(f"ascend_rl: {tool} was removed: {GONE[tool]}", file=sys.stderr)
        return 2
    if tool not in TOOLS:
        print(f"ascend_rl: error: unknown tool '{tool}'; known: {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    sys.argv = [f"python3 -m ascend_rl {tool}", *rest]
    runpy.run_module(TOOLS[tool][0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
