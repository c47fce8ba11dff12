#!/usr/bin/env python3
"""Save throughput to an S3-compatible server on loopback against the same save to local disk.

Starts tests/integration/s3_server.py (moto, signatures checked), then runs
`stagehand-bench save` on the same synthetic state, alternating round by round,
once into a local folder and once into s3://bench-bucket/run<round> (each rank writes its files into
--work-dir, uploads them, multipart above the threshold, and the coordinator commits metadata and
tracker in the store). Reports median save times and the throughput ratio (cloud over local).

  bench/compare_upload.py --bench build/bin/stagehand-bench --out /tmp/stagehand-upload \
      --ranks 2 --bytes-per-rank 256M --rounds 3 --repeat 2
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))


def run(args, out, env, work):
    cmd = bench_common.save_command(args, out, args.repeat, "--work-dir", work)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"stagehand-bench failed: {proc.stderr}")
    return bench_common.save_lines(proc.stdout)


def main():
    p = bench_common.parser(__doc__, "256M", 32, 4, 3, 2)
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
