#!/usr/bin/env bash
# One set-up step run quietly, with a heartbeat: sourced by setup_dev.sh and setup_e2e.sh (pip -q is minutes of silence).
#   STEP_TAG=setup STEP_DIR=.venv STEP_LOG=$(mktemp); source scripts/step.sh; step "installing x" pip install x
# step prints "$STEP_TAG: <what>", then every SETUP_HEARTBEAT_S seconds (30) while the command runs how long so far
# and how big STEP_DIR has grown. A failed command's last log lines go to stderr with "$STEP_TAG: failed while: …",
# then step_failed (defined by the caller, optional: e.g. remove a half-built environment) runs and the shell exits 1.
step() {
  echo "$STEP_TAG: $1"
  shift
  local pid rc=0 start=$SECONDS every="${SETUP_HEARTBEAT_S:-30}"
  local next=$((start + every))
  "$@" >"$STEP_LOG" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ "$SECONDS" -ge "$next" ] && kill -0 "$pid" 2>/dev/null; then
      echo "$STEP_TAG:   ... $((SECONDS - start)) s so far, $(du -sm "$STEP_DIR" 2>/dev/null | cut -f1 || echo 0) MB in $STEP_DIR"
      next=$((next + every))
    fi
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -v "^WARNING: Location" "$STEP_LOG" | tail -15 >&2
    echo "$STEP_TAG: failed while: ${*:0:6}...; check the network and run again" >&2
    if declare -F step_failed >/dev/null; then step_failed; fi
    exit 1
  fi
}
