#!/usr/bin/env bash
# Runs stagehand-train as 4 processes on two "hosts" (two network namespaces joined by a veth
# pair, 10.77.0.1 and 10.77.0.2; ranks 0-1 on the first, 2-3 on the second, MASTER_ADDR the first)
# and checks that the checkpoint equals the one 4 in-process Workers write. Needs root and
# iproute2; the namespaces share this machine's file system, which stands in for a shared mount.
#
#   scripts/two-host-check.sh [build/bin]
set -euo pipefail
bin=${1:-build/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
a=stagehand-host-a
b=stagehand-host-b
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a"
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
pids=()
for r in 0 1 2 3; do
  ns=$a
  [ "$r" -ge 2 ] && ns=$b
  ip netns exec "$ns" env WORLD_SIZE=4 RANK=$r LOCAL_RANK=$((r % 2)) MASTER_ADDR=10.77.0.1 MASTER_PORT=29777 \
    "$bin/stagehand-train" "${args[@]}" --set trainer.ckpt_path="$work/hosts" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$bin/stagehand-train" "${args[@]}" --set trainer.ckpt_path="$work/inproc"
diff -r "$work/hosts/global_step_40" "$work/inproc/global_step_40"
echo "two hosts: 4 ranks over 10.77.0.1/10.77.0.2 wrote the same checkpoint as 4 in-process Workers"
