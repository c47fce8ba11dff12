#!/usr/bin/env bash
# Starts N local processes of COMMAND, one per rank, as cluster launchers do: each gets RANK,
# LOCAL_RANK, WORLD_SIZE=N, MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default: a free
# port), and STAGEHAND_PORT (default: another free port; the Checkpointer's control port). Waits
# for all of them and exits with the worst exit code (128+signal for a killed one). When one
# fails, the others get GRACE_S seconds (default 30) to stop on their own, then SIGTERM, and
# KILL_S seconds (default 10) more before SIGKILL (a stopped or stuck rank ends too). With
# TIMEOUT_S set, ranks still running that many seconds after the start are named, sent SIGTERM,
# then SIGKILL KILL_S seconds later, and the launcher exits 124 (a hung rank cannot hold it);
# where gdb is installed, each such rank's threads' stacks are printed first (to stderr).
# SIGTERM or SIGINT to the launcher goes to every rank.
#
#   scripts/launch-local.sh 4 build/bin/stagehand-train --config examples/configs/sync_rl.yaml
set -uo pipefail

if [ "$#" -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N COMMAND [ARGS...]" >&2
  exit 2
fi
n=$1
shift
export WORLD_SIZE=$n
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
if [ -z "${MASTER_PORT:-}" ]; then
  MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
export MASTER_PORT
if [ -z "${STAGEHAND_PORT:-}" ]; then
  STAGEHAND_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
export STAGEHAND_PORT
grace=${GRACE_S:-30}
kill_after=${KILL_S:-10}
limit=${TIMEOUT_S:-}
if [ -n "$limit" ] && ! [[ "$limit" =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: TIMEOUT_S must be a whole number of seconds, not '$limit'" >&2
  exit 2
fi
started_at=$(date +%s)
timed_out=""

pids=()
forward() {
  for pid in "${pids[@]}"; do kill -"$1" "$pid" 2>/dev/null; done
}
trap 'forward TERM' TERM
trap 'forward INT' INT
declare -A rank_of=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r "$@" &
  pids+=($!)
  rank_of[$!]=$r
done

worst=0
failed_at=""
remaining=$n
declare -A done_pids=()
while [ "$remaining" -gt 0 ]; do
  for pid in "${pids[@]}"; do
    [ -n "${done_pids[$pid]:-}" ] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      code=$?
      done_pids[$pid]=1
      remaining=$((remaining - 1))
      [ "$code" -gt "$worst" ] && worst=$code
      if [ "$code" -ne 0 ] && [ -z "$failed_at" ]; then failed_at=$(date +%s); fi
    fi
  done
  if [ -n "$limit" ] && [ -z "$timed_out" ] && [ "$remaining" -gt 0 ] &&
    [ $(($(date +%s) - started_at)) -ge "$limit" ]; then
    timed_out=1
    left=""
    for pid in "${pids[@]}"; do [ -z "${done_pids[$pid]:-}" ] && left="$left ${rank_of[$pid]}"; done
    echo "$0: ranks$left still running after TIMEOUT_S=$limit s: stopping them" >&2
    if command -v gdb > /dev/null; then
      for pid in "${pids[@]}"; do
        [ -n "${done_pids[$pid]:-}" ] && continue
        echo "== rank ${rank_of[$pid]} (pid $pid): its threads' stacks" >&2
        timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt" < /dev/null 2>&1 | grep -v '^\[New LWP\|^\[Thread debugging' | tail -n 400 >&2
      done
    fi
    # As if a rank had failed GRACE_S seconds ago: the path below sends SIGTERM now, SIGKILL
    # KILL_S seconds later.
    failed_at=$(($(date +%s) - grace))
  fi
  if [ -n "$failed_at" ]; then
    waited=$(($(date +%s) - failed_at))
    signal=""
    [ "$waited" -ge "$grace" ] && signal=TERM
    [ "$waited" -ge $((grace + kill_after)) ] && signal=KILL
    if [ -n "$signal" ]; then
      for pid in "${pids[@]}"; do
        [ -z "${done_pids[$pid]:-}" ] && kill -"$signal" "$pid" 2>/dev/null
      done
    fi
  fi
  [ "$remaining" -gt 0 ] && sleep 0.2
done
if [ -n "$timed_out" ]; then exit 124; fi
exit "$worst"
