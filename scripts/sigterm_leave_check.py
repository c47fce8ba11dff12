#!/usr/bin/env python3
"""How long a worker rank of stagehand-train takes to leave the job after SIGTERM (a diagnosis
of multiprocess_test's sigterm_to_a_worker_process_stops_it_and_fails_the_job_naming_it, which
allows 15 s). Starts four ranks in processes of their own, waits for the first commit, sends
SIGTERM to rank 2 and prints how long it took to exit, TRIALS times:

  --when save    while a save is in flight (a .tmp step folder exists; saves every step with
                 model.hidden=4096, so that one lasts)
  --when random  at a random moment in the 0.5 s after the first commit (saves every 20 steps)

    python3 scripts/sigterm_leave_check.py [--trials 6] [--when save|random] [--bin build/bin]
        [--dir /work/sigterm]
"""
import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--when", choices=["save", "random"], default="save")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    ap.add_argument("--dir", default="/work/sigterm")
    args = ap.parse_args()
    config = os.path.join(HERE, "..", "examples", "configs", "sync_rl.yaml")
    sets = ["trainer.total_steps=100000000", "trainer.max_ckpts_to_keep=0", "trainer.call_timeout_s=60"]
    sets += ["trainer.ckpt_interval=1", "model.hidden=4096"] if args.when == "save" else ["trainer.ckpt_interval=20"]
    for trial in range(args.trials):
        d = os.path.join(args.dir, str(trial))
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        port = free_port()
        cmd = [os.path.join(args.bin, "stagehand-train"), "--quiet", "--config", config,
               "--set", f"trainer.ckpt_path={d}/ckpt"]
        for s in sets:
            cmd += ["--set", s]
        procs = []
        for r in range(4):
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port)}
            with open(os.path.join(d, f"r{r}.log"), "w") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 120
        ready = False
        while time.time() < deadline and not ready:
            names = os.listdir(os.path.join(d, "ckpt")) if os.path.isdir(os.path.join(d, "ckpt")) else []
            committed = "latest_ckpt_global_step.txt" in names
            ready = committed and (args.when == "random" or any(n.endswith(".tmp") for n in names))
            if not ready:
                time.sleep(0.002)
        if ready and args.when == "random":
            time.sleep(random.random() * 0.5)
        start = time.time()
        procs[2].send_signal(signal.SIGTERM)
        try:
            procs[2].wait(timeout=70)
            left = f"{time.time() - start:.2f} s"
        except subprocess.TimeoutExpired:
            left = "not within 70 s"
        for p in procs:
            try:
                p.wait(timeout=70)
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"trial {trial}: {'signalled' if ready else 'no commit within 120 s, signalled anyway'}; "
              f"rank 2 left after {left}, exit code {procs[2].returncode}", flush=True)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
