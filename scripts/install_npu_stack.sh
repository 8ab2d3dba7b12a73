#!/usr/bin/env bash
# Install the Ascend training stack on an NPU host (or in the Docker image), in the seed's order:
#   1. the repository's requirements (and verl's requirements-npu.txt when the tree has one),
#      resolved under the base's constraints file, and tensorboard (the launchers' default logger);
#   2. the pins, one group at a time: torch, torch_npu, torchvision, transformers, ray, sympy,
#      gguf, compressed-tensors (torch/torchvision from TORCH_INDEX_URL, the PyTorch CPU index);
#   3. vllm, then vllm-ascend; vllm brings uvloop back at the version the constraints pin; where the constraints
#      pin triton-ascend (verl 0.9.1), triton-ascend again in place of any triton;
#   4. the recipe's extras the base's constraints pin (recipe.toml [stack] extras; none for qwen2_5): megatron-core
#      and Megatron-Bridge (--no-deps), mbridge, and MindSpeed cloned at its pinned commit into MINDSPEED_DIR, then
#      pip install --no-deps -e and its requirements under the pins;
#   5. the recipe's patched verl tree, editable, --no-deps (fetched and patched first);
#   6. ascend_rl/stack.py --recipe: fails when any installed version or commit is off the pins.
# Every version and commit comes from the base's constraints file (constraints.txt; constraints-0.9.1.txt for
# verl 0.9.1: `python3 -m ascend_rl resolve` names it) through pip -c and `stack --git-source`; none is written here.
# The seed uninstalls uvloop before installing vllm, which reinstalls it; uvloop must stay: vLLM 0.13's openai
# api_server (imported by verl's async rollout server) imports it.
#
#   bash scripts/install_npu_stack.sh [--recipe qwen2_5|deepseek_r1] [--verl-dir DIR] [--dry-run]
#   VERL_BASE (default: the recipe's default_base): the verl base whose tree is fetched and patched
#   MINDSPEED_DIR (default llm_rl/<recipe>/MindSpeed): where MindSpeed is cloned (git-ignored)
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

RECIPE=qwen2_5
VERL_DIR=""
DRY_RUN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --recipe) RECIPE="${2:?--recipe needs a name}"; shift 2 ;;
    --verl-dir) VERL_DIR="${2:?--verl-dir needs a folder}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "install_npu_stack.sh: unknown argument '$1'; run with --help" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
# The verl base (VERL_BASE, else the recipe's default_base) and its tree, resolved as the launchers resolve them
# (the manifest reader needs only Python 3.11's standard library); an unknown recipe or base: one line, exit 2.
resolved="$(cd "$REPO_DIR" && "$PYTHON" -m ascend_rl resolve "$RECIPE" --base "${VERL_BASE:-}" --shell)" || exit 2
eval "$resolved"
VERL_DIR="${VERL_DIR:-$RECIPE_TREE}"
MINDSPEED_DIR="${MINDSPEED_DIR:-$REPO_DIR/llm_rl/$RECIPE/MindSpeed}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
# the base's stack pins (constraints.txt, or the base's own file: constraints-0.9.1.txt), as resolved above
C="$RECIPE_CONSTRAINTS"

run() {
  echo "+ $*"
  [ "$DRY_RUN" -eq 1 ] || "$@"
}
pip_c() { run "$PYTHON" -m pip install --disable-pip-version-check -c "$C" "$@"; }

cd "$REPO_DIR"
run "$PYTHON" -m ascend_rl overlay fetch "$RECIPE" --base "$VERL_BASE" --dest "$VERL_DIR"
run "$PYTHON" -m ascend_rl overlay apply "$RECIPE" --base "$VERL_BASE" --target "$VERL_DIR"

pip_c -r requirements.txt
if [ -f "$VERL_DIR/requirements-npu.txt" ]; then
  pip_c -r "$VERL_DIR/requirements-npu.txt"
fi
pip_c tensorboard

pip_c --index-url "$TORCH_INDEX_URL" torch
pip_c torch_npu
pip_c --index-url "$TORCH_INDEX_URL" torchvision
pip_c transformers
pip_c ray
pip_c sympy
pip_c gguf
pip_c compressed-tensors

# vllm-ascend needs vllm's Python package only, built from source with VLLM_TARGET_DEVICE=empty as
# vLLM-Ascend's build-from-source steps do (docs/source/installation.md at v0.13.0): no kernels, and
# requirements/common.txt, which has no torch (the build itself pulls a torch into pip's build env).
# --no-binary: PyPI's vllm wheels (x86_64 and aarch64) require the CUDA torch 2.9.0, which the torch
# pin refuses, and pip does not fall back to the sdist by itself (ResolutionImpossible).
run env VLLM_TARGET_DEVICE=empty "$PYTHON" -m pip install --disable-pip-version-check -c "$C" --no-binary vllm vllm
pip_c vllm-ascend
# A stack that pins triton-ascend (constraints-0.9.1.txt: vllm-ascend 0.23 runs kernels on it) keeps it the only
# `triton`: vllm-ascend's Dockerfile removes the triton vLLM brings on x86 (:51-53), then triton and triton-ascend,
# and reinstalls triton-ascend (:70-71).
if grep -q '^triton-ascend==' "$C"; then
  run "$PYTHON" -m pip uninstall -y triton triton-ascend
  pip_c triton-ascend
fi

# The recipe's extras the stack pins. megatron-core --no-deps as verl 0.6.0's images install Megatron (its declared
# deps, nvidia-modelopt among them, are not needed to train); MindSpeed is not on PyPI: clone, check out the pinned
# commit, pip install -e (MindSpeed's documented install, --no-deps here), its deps under the pins.
EXTRAS="$("$PYTHON" -m ascend_rl stack --constraints "$C" --recipe "$RECIPE" --list-extras)"
# Megatron-Bridge --no-deps too: it declares transformers<5.0.0, which 0.9.1's transformers 5.5.4 pin refuses
# (constraints-0.9.1.txt). MindSpeed's own requirements go in after it, each package the stack pins left to its pin
# (`stack --requirements`): its numpy<=1.26.0 against 0.9.1's numpy 2 (constraints-0.9.1.txt says why).
for name in $EXTRAS; do
  case "$name" in
    megatron-core|megatron-bridge) pip_c --no-deps "$name" ;;
    mindspeed)
      src="$("$PYTHON" -m ascend_rl stack --constraints "$C" --git-source mindspeed)"
      read -r url commit <<<"$src"
      if [ -d "$MINDSPEED_DIR/.git" ]; then
        run git -C "$MINDSPEED_DIR" fetch --quiet origin
      else
        run git clone --quiet "$url" "$MINDSPEED_DIR"
      fi
      run git -C "$MINDSPEED_DIR" checkout --quiet --detach "$commit"
      pip_c --no-deps -e "$MINDSPEED_DIR"
      reqs="$MINDSPEED_DIR/.recipes-requirements.txt"
      echo "+ $PYTHON -m ascend_rl stack --constraints $C --requirements $MINDSPEED_DIR/requirements.txt > $reqs"
      if [ "$DRY_RUN" -eq 0 ]; then
        "$PYTHON" -m ascend_rl stack --constraints "$C" --requirements "$MINDSPEED_DIR/requirements.txt" >"$reqs"
      fi
      pip_c -r "$reqs"
      ;;
    *) pip_c "$name" ;;
  esac
done

run "$PYTHON" -m pip install --disable-pip-version-check --no-deps -e "$VERL_DIR"
run "$PYTHON" -m ascend_rl stack --constraints "$C" --recipe "$RECIPE"
