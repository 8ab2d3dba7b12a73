#!/usr/bin/env bash
# Start a recipe container on an Atlas host with the seed's device nodes and mounts.
#
#   bash docker/run_container.sh [--image IMAGE] [--name NAME] [--devices 0,1,2,3] [--shm-size 8g] [--dry-run]
#
# --devices lists the /dev/davinciN cards to map (default 0, the single-card recipe; an A3
# node uses 0-15 as "0,1,...,15"). The driver, add-ons and the management device nodes
# (davinci_manager, devmm_svm, hisi_hdc) are always mapped; the repository is mounted at
# /workspace. --shm-size enlarges /dev/shm for vLLM and Ray (the seed uses 8g).
# Then: docker exec -it NAME bash. Extra arguments after -- go to `docker run`.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

IMAGE="ascend-rl-recipes:qwen2_5"
NAME="qwen-grpo"
DEVICES="0"
SHM_SIZE="8g"
DRY_RUN=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --image) IMAGE="${2:?--image needs a name}"; shift 2 ;;
    --name) NAME="${2:?--name needs a name}"; shift 2 ;;
    --devices) DEVICES="${2:?--devices needs a list like 0,1,2,3}"; shift 2 ;;
    --shm-size) SHM_SIZE="${2:?--shm-size needs a size like 8g}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_container.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
  esac
done

CMD=(docker run -d -it --name "$NAME" --shm-size="$SHM_SIZE")
for dev in ${DEVICES//,/ }; do
  CMD+=(--device="/dev/davinci$dev")
done
CMD+=(
  --device=/dev/davinci_manager
  --device=/dev/devmm_svm
  --device=/dev/hisi_hdc
  -v /usr/local/Ascend/driver:/usr/local/Ascend/driver
  -v /usr/local/Ascend/add-ons:/usr/local/Ascend/add-ons
  -v "$REPO_DIR":/workspace
  "${EXTRA[@]}"
  "$IMAGE" /bin/bash
)
echo "${CMD[*]}"
[ "$DRY_RUN" -eq 1 ] || "${CMD[@]}"
