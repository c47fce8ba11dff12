#!/usr/bin/env python3
"""Save throughput to an S3-compatible server on loopback against the same save to local disk.

Starts tests/integration/s3_server.py (moto, signatures checked), then runs
`stagehand-bench save --via-actors` on the same synthetic state, alternating round by round,
once into a local folder and once into s3://bench-bucket/run<round> (each rank writes its files into
--work-dir, uploads them, multipart above the threshold, and the coordinator commits metadata and
tracker in the store). Reports median save times and the throughput ratio (cloud over local).

  bench/compare_upload.py --bench build/bin/stagehand-bench --out /tmp/stagehand-upload \
      --ranks 2 --bytes-per-rank 256M --rounds 3 --repeat 2
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(args, out, env, work):
    cmd = [args.bench, "save", "--via-actors", "--out", out, "--work-dir", work, "--ranks", str(args.ranks),
           "--bytes-per-rank", args.bytes_per_rank, "--tensors", str(args.tensors),
           "--thread-count", str(args.thread_count), "--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"stagehand-bench failed: {proc.stderr}")
    return [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{") and "summary" not in l]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True)
    p.add_argument("--out", required=True, help="local folder for the disk saves and the work dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes-per-rank", default="256M")
    p.add_argument("--tensors", type=int, default=32)
    p.add_argument("--thread-count", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "tests", "integration", "s3_server.py"),
                               "--bucket", "bench-bucket"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        info = json.loads(server.stdout.readline())
        env = dict(os.environ, AWS_ACCESS_KEY_ID=info["access_key"], AWS_SECRET_ACCESS_KEY=info["secret_key"],
                   AWS_ENDPOINT_URL=info["endpoint"], AWS_REGION="us-east-1")
        saves = {"local": [], "s3": []}
        for r in range(args.rounds):
            for mode in ("local", "s3"):
                local = os.path.join(args.out, "local")
                out = local if mode == "local" else f"s3://bench-bucket/run{r}"
                for line in run(args, out, env, os.path.join(args.out, "work")):
                    saves[mode].append(line)
                    print(json.dumps({"round": r, "destination": mode, **line}), flush=True)
                shutil.rmtree(local, ignore_errors=True)
        med = {m: statistics.median(x["save_s"] for x in saves[m]) for m in saves}
        nbytes = saves["local"][0]["bytes"]
        print(json.dumps({"summary": "upload", "bytes": nbytes, "median_local_save_s": med["local"],
                          "median_s3_save_s": med["s3"],
                          "local_gbps": nbytes / med["local"] / 1e9, "s3_gbps": nbytes / med["s3"] / 1e9,
                          "s3_throughput_vs_local": med["local"] / med["s3"]}), flush=True)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
