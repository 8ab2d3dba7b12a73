#!/usr/bin/env bash
# Start a recipe container on an Atlas host with the NPU devices and host files vllm-ascend's docs mount.
#
#   bash docker/run_container.sh [--image IMAGE] [--name NAME] [--devices 0,1,2,3|all] [--shm-size 8g]
#        [--models DIR] [--data DIR] [--checkpoints DIR] [--logs DIR] [--cache DIR] [--dry-run] [-- docker args]
#
# --devices: the /dev/davinciN cards to map (default 0, the single-card recipe; "all" maps every card,
# an A3 node's 16). Always mapped, as vllm-ascend's container instructions do: davinci_manager, devmm_svm,
# hisi_hdc, npu-smi, /usr/local/dcmi, the driver (/usr/local/Ascend/driver), /etc/ascend_install.info,
# and the firmware and add-ons folders when the host has them. The repository is mounted at /workspace.
# Weights, data, checkpoints, logs and caches can live outside it: --models DIR -> /models, --data DIR ->
# /data, --checkpoints DIR -> /checkpoints (CKPT_DIR), --logs DIR -> /logs (LOG_DIR), --cache DIR ->
# /root/.cache (Hugging Face hub, pip, the verl sdist; default ~/.cache). Then, e.g.:
#   docker exec -it NAME bash -c 'MODEL_DIR=/models/Qwen2_5_1_5B_Instruct DATA_DIR=/data/math bash llm_rl/...'
# --shm-size enlarges /dev/shm for vLLM and Ray (8g, as cann-recipes-train's guide). Extra arguments after
# -- go to `docker run`.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

IMAGE="ascend-rl-recipes:qwen2_5"
NAME="qwen-grpo"
DEVICES="0"
SHM_SIZE="8g"
DRY_RUN=0
CACHE_DIR="${HOME:-/root}/.cache"
MOUNTS=()
ENVS=()
EXTRA=()
need() { [ -n "${2:-}" ] || { echo "run_container.sh: $1 needs a value; run with --help" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --image) need "$1" "${2:-}"; IMAGE="$2"; shift 2 ;;
    --name) need "$1" "${2:-}"; NAME="$2"; shift 2 ;;
    --devices) need "$1" "${2:-}"; DEVICES="$2"; shift 2 ;;
    --shm-size) need "$1" "${2:-}"; SHM_SIZE="$2"; shift 2 ;;
    --models) need "$1" "${2:-}"; MOUNTS+=(-v "$2:/models"); shift 2 ;;
    --data) need "$1" "${2:-}"; MOUNTS+=(-v "$2:/data"); shift 2 ;;
    --checkpoints) need "$1" "${2:-}"; MOUNTS+=(-v "$2:/checkpoints"); ENVS+=(-e CKPT_DIR=/checkpoints); shift 2 ;;
    --logs) need "$1" "${2:-}"; MOUNTS+=(-v "$2:/logs"); ENVS+=(-e LOG_DIR=/logs); shift 2 ;;
    --cache) need "$1" "${2:-}"; CACHE_DIR="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_container.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
  esac
done

CARDS=()
if [ "$DEVICES" = all ]; then
  for dev in /dev/davinci[0-9]*; do [ -e "$dev" ] && CARDS+=("$dev"); done
  if [ "${#CARDS[@]}" -eq 0 ]; then
    echo "run_container.sh: --devices all found no /dev/davinciN on this host; install the Ascend driver and firmware (npu-smi info lists the cards)" >&2
    exit 1
  fi
else
  for dev in ${DEVICES//,/ }; do
    case "$dev" in ''|*[!0-9]*) echo "run_container.sh: --devices takes card numbers like 0,1,2,3 or 'all', not '$DEVICES'" >&2; exit 2 ;; esac
    CARDS+=("/dev/davinci$dev")
  done
fi

# What every NPU container needs from the host (vllm-ascend's docker instructions), then what it may have.
REQUIRED=(/dev/davinci_manager /dev/devmm_svm /dev/hisi_hdc /usr/local/dcmi /usr/local/bin/npu-smi
  /usr/local/Ascend/driver /etc/ascend_install.info)
OPTIONAL=(/usr/local/Ascend/firmware /usr/local/Ascend/add-ons)
if [ "$DRY_RUN" -eq 0 ]; then
  for path in "${CARDS[@]}" "${REQUIRED[@]}"; do
    if [ ! -e "$path" ]; then
      echo "run_container.sh: $path is missing on this host; install the Ascend driver and firmware (npu-smi info lists the cards) or fix --devices" >&2
      exit 1
    fi
  done
fi

CMD=(docker run -d -it --name "$NAME" --shm-size="$SHM_SIZE")
for dev in "${CARDS[@]}"; do CMD+=(--device="$dev"); done
CMD+=(--device=/dev/davinci_manager --device=/dev/devmm_svm --device=/dev/hisi_hdc)
CMD+=(-v /usr/local/dcmi:/usr/local/dcmi -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi)
CMD+=(-v /usr/local/Ascend/driver:/usr/local/Ascend/driver -v /etc/ascend_install.info:/etc/ascend_install.info)
for path in "${OPTIONAL[@]}"; do
  if [ -e "$path" ] || [ "$DRY_RUN" -eq 1 ]; then CMD+=(-v "$path:$path"); fi
done
CMD+=(-v "$REPO_DIR":/workspace -v "$CACHE_DIR":/root/.cache "${MOUNTS[@]}" "${ENVS[@]}")
CMD+=("${EXTRA[@]}" "$IMAGE" /bin/bash)
echo "${CMD[*]}"
[ "$DRY_RUN" -eq 1 ] || "${CMD[@]}"
