#!/usr/bin/env bash
# Start this node's Ray process for the DeepSeek-R1 A3 run (run on every node first).
#
#   bash ray_start.sh --head [--nodes 16] [--timeout 1800] [--cpu] [--dry-run]   on the head node
#   bash ray_start.sh --worker HEAD_IP[:6379] [--cpu] [--dry-run]                 on each other node
#
# Each A3 node offers 16 NPU resources (8 cards, 2 dies each; NPUS_PER_NODE overrides).
# SOCKET_IFNAME names the cluster network interface (default: the default route's); it is
# exported as GLOO_SOCKET_IFNAME, HCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME. An interface the
# node lacks: one line naming it and the node's interfaces, exit 1, no Ray started. The head
# waits until --nodes nodes joined and fails with one line (how many of how many) after
# --timeout seconds. Then `python3 -m ascend_rl ray_cluster wait --nodes N --resource NAME=COUNT`
# checks that every node offers what the ranks' placement bundles ask for (docs/cluster.md).
# Python: PYTHON, else python3 on PATH, else the repository's venvs, as the launcher finds it
# (scripts/find_python.sh); Ray is the `ray` installed with that Python, not PATH's.
# --cpu (or PROFILE=cpu): a node without NPUs, for a CPU run across nodes (the simulated
# cluster, docs/cluster.md): NPUS_PER_NODE ranks (default 1) of the
# lowercase `cpu` resource verl's CPU bundles ask for, a 512 MiB object store, no dashboard,
# the CPU verl tree (verl-<base>-cpu). --object-store-memory SIZE overrides the store.
# Before Ray starts, the node makes its verl tree (VERL_DIR, default the base's verl-<base>[-cpu]) ready as the
# launcher's preflight does: fetched when absent (the pinned sdist, through the download cache RECIPES_CACHE: a node
# without the index needs it there), the series applied; a tree it cannot make ready is one line, exit 1, no Ray.
set -euo pipefail

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$RECIPE_DIR/../.." && pwd)"
case " $* " in *" --help "*|*" -h "*) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;; esac

# --cpu or PROFILE=cpu (as the launcher takes them): passed on to ray_cluster start once
PROFILE="${PROFILE:-npu}"
case " $* " in *" --cpu "*) PROFILE=cpu ;; esac
case "$PROFILE" in
  npu) ;;
  cpu) case " $* " in *" --cpu "*) ;; *) set -- "$@" --cpu ;; esac ;;
  *) echo "$(basename "$0"): PROFILE must be npu or cpu, not '$PROFILE'" >&2; exit 2 ;;
esac

# Ray workers inherit this environment from the raylet: set it here, on every node.
# shellcheck source=llm_rl/deepseek_r1/env.sh
source "$RECIPE_DIR/env.sh"
export HCCL_HOST_SOCKET_PORT_RANGE="${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}"
export HCCL_NPU_SOCKET_PORT_RANGE="${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}"
export HCCL_BUFFSIZE="${HCCL_BUFFSIZE:-256}"
export ASCEND_GLOBAL_LOG_LEVEL="${ASCEND_GLOBAL_LOG_LEVEL:-3}"
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
# Ray's token authentication, said explicitly: Ray 2.60 (the 0.9.1 stack's; 2.41, the 0.13 stack's, has none) starts a
# head in token mode whenever ~/.ray/auth_token exists (a ray.init on the machine writes one: ray/_private/worker.py:1873),
# while a client given an address, as this script's node wait and the job's driver are, connects in the mode
# RAY_AUTH_MODE says (unset: disabled; worker.py:1973-1977) and is refused ("InvalidAuthToken"). Disabled is what
# `ray start` gives where there is no token file; for token mode set RAY_AUTH_MODE=token for every node and the job,
# with the same token on each.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
[ "$PROFILE" != cpu ] || NPUS_PER_NODE="${NPUS_PER_NODE:-1}"

# shellcheck source=../../scripts/find_python.sh
source "$REPO_DIR/scripts/find_python.sh"
recipes_find_python "$(basename "$0")" "$RECIPE_DIR/recipe.toml" || exit 1
"$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("ray") is None)' 2>/dev/null || {
  echo "$(basename "$0"): $PYTHON has no ray; install the stack into it or set PYTHON to the Python ray is installed in" >&2
  exit 1
}
# The base (VERL_BASE, else recipe.toml's default_base) and its tree, resolved as the launcher resolves them
# (the CPU profile's tree is verl-<base>-cpu); an unknown base: one line, exit 2.
resolved="$(cd "$REPO_DIR" && "$PYTHON" -m ascend_rl resolve deepseek_r1 --base "${VERL_BASE:-}" --profile "$PROFILE" --shell)" \
  || exit 2
eval "$resolved"
recipes_base_env  # env.sh: VLLM_USE_V1 on the vLLM 0.13 bases only
VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"
export PYTHONPATH="$VERL_DIR${PYTHONPATH:+:$PYTHONPATH}"
# On CPU the base's cpu_env (recipe.toml; on 0.9.1 the CPU platform and engine device verl's workers select): this
# node's Ray workers are the raylet's children and inherit nothing else of the launcher's; a variable set here wins
if [ "$PROFILE" = cpu ]; then
  # shellcheck disable=SC2154  # BASE_CPU_ENV: from `ascend_rl resolve` above
  for pair in "${BASE_CPU_ENV[@]}"; do
    name="${pair%%=*}"
    export "$name=${!name:-${pair#*=}}"
  done
fi

# The verl tree, made ready on this node before its Ray starts, as the launcher's preflight makes it (fetched when
# absent, the series applied): a Ray worker started before the tree exists never imports verl from it, and Ray starts
# workers with the node. The interface is checked first (a dry run of the start, cheap); a dry run says what it would
# change. A tree that cannot be made ready: one line, exit 1, no Ray started.
case " $* " in
  *" --dry-run "*) PREPARE=(--dry-run) ;;
  *) PREPARE=()
     PYTHONPATH="$REPO_DIR:$PYTHONPATH" "$PYTHON" -m ascend_rl ray_cluster start --npus "${NPUS_PER_NODE:-16}" "$@" \
       --dry-run >/dev/null || exit $? ;;
esac
(cd "$REPO_DIR" && "$PYTHON" -m ascend_rl resolve deepseek_r1 --base "$VERL_BASE" --profile "$PROFILE" \
  --prepare-tree "$VERL_DIR" "${PREPARE[@]}" | sed "s/^/$(basename "$0"): /"; exit "${PIPESTATUS[0]}") >&2 || exit 1
# a dry run says what this node's Ray workers would run (the launcher's node wait compares it with the job's)
case " $* " in *" --dry-run "*) echo "$(basename "$0"): Ray workers run $PYTHON with verl $VERL_BASE from $VERL_DIR" >&2 ;; esac
# /dev/shm on this node: what an earlier run's processes here left when it was killed goes first (by the names they
# recorded; the launchers' own record, ascend_rl/shm_record/), then this node's Ray workers record theirs
case " $* " in *" --dry-run "*) ;; *)
  if [ -z "${RECIPES_SHM_RECORD:-}" ]; then
    (cd "$REPO_DIR" && "$PYTHON" -m ascend_rl shm clean) || true
    SHM_RECORDS="${RECIPES_SHM_RECORDS:-${RECIPES_CACHE:-$HOME/.cache/ascend-rl-recipes}/shm}"
    RECIPES_SHM_RECORD="$SHM_RECORDS/{host}/ray_$(date +%Y%m%d_%H%M%S)_$$.jsonl"
    export RECIPES_SHM_RECORD
    PYTHONPATH="$REPO_DIR/ascend_rl/shm_record:$PYTHONPATH"
  fi ;;
esac
# verl's CPU platform (the base's cpu_env VERL_PLATFORM=cpu, verl 0.9.1: cpu-0014) asks Ray's GPU resource per rank
GPUS=()
[ "$PROFILE" != cpu ] || [ "${VERL_PLATFORM:-}" != cpu ] || GPUS=(--gpus)
PYTHONPATH="$REPO_DIR:$PYTHONPATH" exec "$PYTHON" -m ascend_rl ray_cluster start --npus "${NPUS_PER_NODE:-16}" "${GPUS[@]}" "$@"
