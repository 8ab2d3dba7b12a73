#!/usr/bin/env bash
# Start this node's Ray process for the DeepSeek-R1 A3 run (run on every node first).
#
#   bash ray_start.sh --head [--nodes 16] [--timeout 1800] [--dry-run]   on the head node
#   bash ray_start.sh --worker HEAD_IP[:6379] [--dry-run]                 on each other node
#
# Each A3 node offers 16 NPU resources (8 cards, 2 dies each; NPUS_PER_NODE overrides).
# SOCKET_IFNAME names the cluster network interface (default: the default route's); it is
# exported as GLOO_SOCKET_IFNAME, HCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME. The head waits
# until --nodes nodes joined and fails with one line after --timeout seconds.
set -euo pipefail

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$RECIPE_DIR/../.." && pwd)"
case " $* " in *" --help "*|*" -h "*) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

# Ray workers inherit this environment from the raylet: set it here, on every node.
# shellcheck source=llm_rl/deepseek_r1/env.sh
source "$RECIPE_DIR/env.sh"
export HCCL_HOST_SOCKET_PORT_RANGE="${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}"
export HCCL_NPU_SOCKET_PORT_RANGE="${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}"
export HCCL_BUFFSIZE="${HCCL_BUFFSIZE:-256}"
export ASCEND_GLOBAL_LOG_LEVEL="${ASCEND_GLOBAL_LOG_LEVEL:-3}"
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
VERL_BASE="${VERL_BASE:-$(sed -n 's/^default_base = "\(.*\)".*/\1/p' "$RECIPE_DIR/recipe.toml")}"
VERL_DIR="${VERL_DIR:-$RECIPE_DIR/verl-$VERL_BASE}"
export PYTHONPATH="$VERL_DIR${PYTHONPATH:+:$PYTHONPATH}"

PYTHONPATH="$REPO_DIR:$PYTHONPATH" exec python3 -m ascend_rl ray_cluster start --npus "${NPUS_PER_NODE:-16}" "$@"
