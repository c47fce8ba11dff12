#!/usr/bin/env bash
# Repeats spmd_test's stalled-rank job N times (4 ranks of build/bin/spmd_rank; rank 3 SIGSTOPped
# 0.7 s into a save with a 4 s limit; the ranks pinned to core 0) and counts the runs in which
# rank 0 is still alive 15 s later (the teardown hang of issue 26). Run it beside busy loops to
# load the machine as CI does:  (for i in 1 2 3; do sh -c 'while :; do :; done' & done; \
#   scripts/repeat-stalled-save.sh 20; kill %1 %2 %3)
set -uo pipefail
n=${1:-10}
bin=${BIN:-build/bin}/spmd_rank
hung=0
for i in $(seq 1 "$n"); do
  d=$(mktemp -d)
  port=$((30000 + RANDOM % 20000))
  for r in 0 1 2 3; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 STAGEHAND_PORT=$port "$bin" save "$d/ckpt" 1 sync \
      > "$d/a$r.log" 2>&1 &
  done
  wait
  port=$((30000 + RANDOM % 20000))
  pids=()
  for r in 0 1 2 3; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 STAGEHAND_PORT=$port taskset -c 0 "$bin" save \
      "$d/ckpt" 2 sync --slow 200000 --timeout-s 4 > "$d/r$r.log" 2>&1 &
    pids+=($!)
  done
  sleep 0.7
  kill -STOP "${pids[3]}"
  for _ in $(seq 1 150); do kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pids[0]}" 2>/dev/null; then
    hung=$((hung + 1))
    echo "run $i: rank 0 still running (logs in $d)"
  else
    rm -rf "$d"
  fi
  kill -9 "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
done
echo "$hung of $n runs left rank 0 running"
