#!/usr/bin/env bash
# Runs stagehand-train as 4 processes on two "hosts" (two network namespaces joined by a veth
# pair, 10.77.0.1 and 10.77.0.2; ranks 0-1 on the first, 2-3 on the second, MASTER_ADDR the first)
# and checks that the checkpoint equals the one 4 in-process Workers write. Needs root and
# iproute2; the namespaces share this machine's file system, which stands in for a shared mount.
# While the ranks run, it samples every TCP connection in both namespaces (ss) and prints which
# ranks' processes are connected and the bytes each connection carried, and fails unless the ranks
# that share a collective group exchanged their bytes on direct connections and each rank's CAF
# connection to rank 0 carried control messages only (nothing relayed through rank 0's node). Exits 77 (skipped), saying why,
# where network namespaces cannot be made (not root, no iproute2, no CAP_SYS_ADMIN).
#
#   scripts/two-host-check.sh [build/bin]
set -euo pipefail
bin=${1:-build/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
a=stagehand-host-a
b=stagehand-host-b
skip() {
  echo "two-host check skipped: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "it needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v ss >/dev/null || skip "iproute2's ss is not installed"
ip netns del "$a" 2>/dev/null || true
ip netns del "$b" 2>/dev/null || true
ip netns add "$a" 2>/dev/null || skip "cannot create a network namespace here (no CAP_SYS_ADMIN?)"
work=$(mktemp -d)
cleanup() {
  [ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null || true
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$b"
ip link add sh-veth-a type veth peer name sh-veth-b
ip link set sh-veth-a netns "$a"
ip link set sh-veth-b netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev sh-veth-a
ip -n "$b" addr add 10.77.0.2/24 dev sh-veth-b
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set sh-veth-a up
ip -n "$b" link set sh-veth-b up

args=(--quiet --config "$root/examples/configs/sync_rl.yaml" --set trainer.total_steps=40
      --set trainer.ckpt_interval=20 --set trainer.max_ckpts_to_keep=0)
# Every 0.2 s: each namespace's established TCP connections with their byte counters.
(
  while true; do
    for ns in "$a" "$b"; do
      ip netns exec "$ns" ss -tinpH state established 2>/dev/null | sed "s/^/$ns /"
    done
    echo "--"
    sleep 0.2
  done
) >"$work/ss.log" &
sampler=$!
pids=()
for r in 0 1 2 3; do
  ns=$a
  [ "$r" -ge 2 ] && ns=$b
  ip netns exec "$ns" env WORLD_SIZE=4 RANK=$r LOCAL_RANK=$((r % 2)) MASTER_ADDR=10.77.0.1 MASTER_PORT=29777 \
    "$bin/stagehand-train" "${args[@]}" --set trainer.ckpt_path="$work/hosts" &
  pids+=($!)
  # ip netns exec and env exec the next program: $! is stagehand-train's pid.
  echo "$! $r" >>"$work/ranks"
done
for pid in "${pids[@]}"; do wait "$pid"; done
kill "$sampler" 2>/dev/null || true
sampler=
# sync_rl.yaml is tensor 2 x data 2: ranks 0-1 and 2-3 share a tensor-parallel group, 0-2 and 1-3
# a data-parallel one.
python3 "$root/scripts/two_host_traffic.py" "$work/ss.log" 10.77.0.1 29777 "$work/ranks" --expect-pairs 0-1,2-3,0-2,1-3
"$bin/stagehand-train" "${args[@]}" --set trainer.ckpt_path="$work/inproc"
diff -r "$work/hosts/global_step_40" "$work/inproc/global_step_40"
echo "two hosts: 4 ranks over 10.77.0.1/10.77.0.2 wrote the same checkpoint as 4 in-process Workers"
