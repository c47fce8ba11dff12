#!/usr/bin/env python3
"""Summarizes the TCP connections scripts/two-host-check.sh sampled with `ss -tinH` in its two
network namespaces: for each connection (by its two endpoints) the most bytes it had sent and
received, split into connections to rank 0's MASTER_PORT (the world and everything CAF routes
through rank 0's node) and the others (direct connections between processes).

  two_host_traffic.py SS_LOG MASTER_ADDR MASTER_PORT
"""
import re
import sys


def plain(endpoint):
    """10.0.0.1:80 for [::ffff:10.0.0.1]:80 too (a listening IPv6 socket's view of an IPv4 peer)."""
    return re.sub(r"^\[(?:::ffff:)?([^\]]+)\]", r"\1", endpoint)


def connections(log):
    """{(local, peer): (bytes_sent, bytes_received)}, the largest counters seen, each connection
    once (the side in the namespace that sampled it; a connection inside one namespace shows from
    both of its ends, kept from the end with the lower local address)."""
    seen = {}
    current = None
    for line in open(log):
        fields = line.split()
        if not fields or fields[0] == "--":
            current = None
            continue
        if len(fields) >= 5 and fields[1].isdigit():
            current = (plain(fields[3]), plain(fields[4]))
            continue
        if current is None:
            continue
        sent = re.search(r"bytes_sent:(\d+)", line)
        received = re.search(r"bytes_received:(\d+)", line)
        old = seen.get(current, (0, 0))
        seen[current] = (max(old[0], int(sent.group(1)) if sent else 0),
                         max(old[1], int(received.group(1)) if received else 0))
    unique = {}
    for (local, peer), counters in seen.items():
        key = tuple(sorted((local, peer)))
        if key not in unique or local < peer:
            unique[key] = ((local, peer), counters)
    return list(unique.values())


def main():
    log, master_addr, master_port = sys.argv[1], sys.argv[2], sys.argv[3]
    master = f"{master_addr}:{master_port}"
    to_master, direct = [], []
    for (local, peer), (sent, received) in connections(log):
        (to_master if master in (local, peer) else direct).append((local, peer, sent + received))
    total = sum(b for *_, b in to_master + direct)
    print(f"traffic: {len(to_master)} connections to rank 0's {master} carried "
          f"{sum(b for *_, b in to_master)} of {total} bytes; {len(direct)} direct connections between processes "
          f"carried {sum(b for *_, b in direct)}")
    for local, peer, b in sorted(to_master + direct, key=lambda c: -c[2]):
        print(f"  {local} <-> {peer}: {b} bytes{' (rank 0 MASTER_PORT)' if master in (local, peer) else ''}")


if __name__ == "__main__":
    main()
