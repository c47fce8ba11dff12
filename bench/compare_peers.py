#!/usr/bin/env python3
"""stagehand against its peers on the same bytes: PyTorch DCP (save, async_save, load), megatron-core
dist_checkpointing (torch_dist) and raw write / read baselines, interleaved round by round, each system
in its own process(es) under `/usr/bin/time -v` for the peak resident set size.

The state is `stagehand-bench save`'s synthetic state: R ranks x B bytes in N tensors (the same names,
dtypes, byte sizes and replication; the peers fill it with pseudo-random bytes); T writer threads.
A Python peer with R ranks is R processes in a gloo process group (MASTER_ADDR=127.0.0.1, a free
MASTER_PORT, RANK, WORLD_SIZE; world size 1 too); stagehand runs its R ranks in one process.

Systems (--systems picks a subset, comma-separated):
  raw_write1        one stream: write + fsync of the checkpoint's bytes, k times per process
  raw_writeT        R*T streams (files of B/T each), write + fsync, k times per process
  raw_readT         R*T threads, cold read (POSIX_FADV_DONTNEED first) of R*T files, k times per process
  dcp_save          torch.distributed.checkpoint.save, FileSystemWriter(thread_count=T, sync_files=True)
  dcp_async         dcp.async_save: blocking part (the call) and total (until the future resolves)
  dcp_load          dcp.load in place, k cold loads then k warm loads (after one untimed save)
  megatron_save     megatron-core dist_checkpointing.save, torch_dist, FullyParallelSaveStrategyWrapper
  stagehand_s0      stagehand-bench save --staging-buckets 0 (--source host when the bench has --source)
  stagehand_s2      stagehand-bench save --staging-buckets 2 (idem)
  stagehand_nowb    stagehand_s0 with --no-early-writeback (no sync_file_range while writing)
  stagehand_async   stagehand-bench save --async --staging-buckets 0: stall_s and save_s (until commit)
  stagehand_s0_reuse, stagehand_s2_reuse, stagehand_async_reuse
                    the same with --reuse-files: from the third save on, each save writes over the data files
                    of the step retired after the save before it (trainer.ckpt_reuse_files)
  stagehand_s0_cached, stagehand_s2_cached, stagehand_async_cached
                    the same with --cached: new files written through the page cache
                    (megatron_config.ckpt_save_uncached false; the others write them around it)
  stagehand_dev_s0  stagehand-bench save --source device --staging-buckets 0   (only if --source exists)
  stagehand_dev_s2  stagehand-bench save --source device --staging-buckets 2   (only if --source exists)
  stagehand_load    stagehand-bench load --cold, after an untimed save      (only if `load` exists)
  stagehand_load_warm  stagehand-bench load (warm)                          (only if `load` exists)
  stagehand_spmd_save   the Checkpointer in R processes, one per rank, as DCP runs (stagehand-spmd-peer):
                        k x save
  stagehand_spmd_async  idem, k x async_save: blocking part and total (until wait() says committed)
  stagehand_spmd_load   idem, one untimed save, k cold loads then k warm loads
Every process makes k (--saves-per-process) saves or loads; figures are kept by position in the process
(save 1, save 2, saves 3+), since the first saves of a process pay for fresh memory pages. Between
processes the checkpoint folder is removed and `sync` runs; loads drop their files from the page cache
(fsync + POSIX_FADV_DONTNEED) before each cold load. Ratios are against baselines of the same run:
the k-th save against DCP's k-th save, raw T-stream write time / save time, stall against DCP
async_save's blocking time, cold load against DCP's cold load and raw read / load time.

Peak RSS minus state: the summed max RSS of the system's processes minus the state all ranks hold; for
Python peers also the summed max RSS minus each process's RSS just before its first save (the torch
import and the state itself excluded).

In-process mode (--in-process): the same torch CPU tensors saved by dcp.save / dcp.async_save / dcp.load
and by stagehand.Checkpointer in one Python process, interleaved, by position in the process: this runs
bench/compare_python.py under --venv's Python with the stagehand package from build/python (PYTHONPATH);
every other flag goes to that script (--rounds, --processes, --max-to-keep, --staging-buckets, ...).

  bench/compare_peers.py --setup                      # once: torch, megatron-core, numpy into --venv
  bench/compare_peers.py --in-process --rounds 5 --processes 4
  bench/compare_peers.py --quick                      # smoke run: 64 MiB, 1 round
  bench/compare_peers.py --bench build/bin/stagehand-bench --out-dir /tmp/stagehand-peers \\
      --ranks 1 --bytes-per-rank 1G --tensors 32 --threads 8 --rounds 3 --saves-per-process 2 \\
      --markdown /tmp/peers.md
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
sys.path.insert(0, PEERS)
import peer_common  # noqa: E402

TIME = "/usr/bin/time"
ALL = ["raw_write1", "raw_writeT", "raw_readT", "dcp_save", "dcp_async", "dcp_load", "megatron_save",
       "stagehand_s0", "stagehand_s2", "stagehand_nowb", "stagehand_async", "stagehand_s0_reuse",
       "stagehand_s2_reuse", "stagehand_async_reuse", "stagehand_s0_cached", "stagehand_s2_cached",
       "stagehand_async_cached", "stagehand_dev_s0", "stagehand_dev_s2",
       "stagehand_load", "stagehand_load_warm", "stagehand_spmd_save", "stagehand_spmd_async", "stagehand_spmd_load"]
SPMD = {"stagehand_spmd_save": "save", "stagehand_spmd_async": "async", "stagehand_spmd_load": "load"}
TORCH_DEPS = ["filelock", "typing-extensions>=4.13.0", "sympy>=1.13.3", "mpmath", "networkx>=2.5.1", "jinja2", "MarkupSafe",
              "fsspec>=0.8.5", "numpy", "packaging>=24.2"]
# Not in megatron-core's requirements, but its torch_dist writer processes call psutil on every save.
MEGATRON_RUNTIME_DEPS = ["psutil"]


# ---------------------------------------------------------------------------------------------- setup

def venv_python(args):
    return os.path.join(args.venv, "bin", "python")


def sh(cmd, timeout=1800, check=True):
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, timeout=timeout, text=True, capture_output=True)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
    if tail:
        print("  " + tail.replace("\n", "\n  "), flush=True)
    if check and proc.returncode != 0:
        raise SystemExit("setup: command failed: " + " ".join(cmd))
    return proc


def pip_install(args, *specs, deps=False):
    cmd = [venv_python(args), "-m", "pip", "install", "--disable-pip-version-check", "--timeout", "120"]
    sh(cmd + ([] if deps else ["--no-deps"]) + list(specs))


def try_import(args, code):
    proc = subprocess.run([venv_python(args), "-c", "import warnings; warnings.filterwarnings('ignore')\n" + code],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def torch_requirements(args):
    ok, out = try_import(args, "import importlib.metadata as m, json; print(json.dumps(m.requires('torch')))")
    if not ok:
        raise SystemExit("setup: cannot read torch's metadata: " + out)
    return [r.split(";")[0].strip() for r in json.loads(out.splitlines()[-1])]


def requirement_for(message, requirements):
    """The torch requirement that provides the library an ImportError names (libcufile.so.0: cannot open
    ...; undefined symbol: ncclCommResume), e.g. nvidia-nccl-cu13==2.30.7 or cuda-toolkit[cufile]==13.2.2."""
    m = re.search(r"lib([A-Za-z0-9]+?)(?:_host|_device)?\.so", message) or re.search(r"undefined symbol: ([a-z]+)",
                                                                                      message)
    if not m:
        return None, False
    key = m.group(1).lower()
    for req in requirements:
        name = re.split(r"[<>=~!\[ ]", req)[0]
        if name.startswith("nvidia-") and key in name.replace("-", ""):
            return req, False
    for req in requirements:
        m2 = re.match(r"(cuda-toolkit)\[([^\]]*)\](.*)", req)
        if m2 and key in m2.group(2).split(","):
            return "%s[%s]%s" % (m2.group(1), key, m2.group(3)), True  # the extra pulls the library's wheel
    return None, False


def setup(args):
    parent = os.path.dirname(os.path.abspath(args.venv))
    os.makedirs(parent, exist_ok=True)
    sh(["df", "-h", parent, tempfile.gettempdir()], check=False)
    for path in (parent, tempfile.gettempdir()):
        free = shutil.disk_usage(path).free
        if free < 4 << 30:
            raise SystemExit("setup: %s has %.1f GiB free; the venv needs about 2 GiB (and pip's cache)" %
                             (path, free / (1 << 30)))
    if not os.path.exists(venv_python(args)):
        sh([sys.executable, "-m", "venv", args.venv])
    ok, _ = try_import(args, "import torch")
    if not ok:
        # PyPI has no CPU-only torch wheel: the CUDA wheel without its ~3 GB of CUDA dependencies, then only
        # the few shared libraries its import really loads.
        pip_install(args, args.torch_spec)
        pip_install(args, *TORCH_DEPS)
        reqs = torch_requirements(args)
        for _ in range(12):
            ok, out = try_import(args, "import torch; print(torch.__version__)")
            if ok:
                break
            req, with_deps = requirement_for(out, reqs)
            if not req:
                raise SystemExit("setup: torch does not import and no requirement matches:\n" + out[-2000:])
            print("setup: torch's import asks for %s" % req, flush=True)
            pip_install(args, req, deps=with_deps)
        else:
            raise SystemExit("setup: torch still does not import")
    ok, _ = try_import(args, "import megatron.core.dist_checkpointing")
    if not ok:
        # megatron-core's own requirements are torch, numpy and packaging; its extras are GPU stacks.
        pip_install(args, args.megatron_spec)
        for _ in range(8):
            ok, out = try_import(args, "import megatron.core.dist_checkpointing, "
                                       "megatron.core.dist_checkpointing.strategies.fully_parallel, "
                                       "megatron.core.dist_checkpointing.strategies.torch")
            if ok:
                break
            m = re.search(r"No module named '([A-Za-z0-9_]+)", out)
            if not m:
                raise SystemExit("setup: megatron-core does not import:\n" + out[-2000:])
            name = {"yaml": "pyyaml"}.get(m.group(1), m.group(1))
            print("setup: megatron-core's import asks for %s" % name, flush=True)
            pip_install(args, name)
    ok, _ = try_import(args, "import psutil")
    if not ok:
        pip_install(args, *MEGATRON_RUNTIME_DEPS)
    ok, out = try_import(args, "import torch, numpy, importlib.metadata as m; import megatron.core.dist_checkpointing;"
                               "print('torch', torch.__version__, 'numpy', numpy.__version__, 'megatron-core',"
                               " m.version('megatron-core'))")
    print(([l for l in out.splitlines() if l.startswith("torch ")] or [out])[-1] if ok else out)
    sh(["du", "-sh", args.venv], check=False)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------ processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(cmds, envs, timeout):
    """Runs the commands at once (the ranks of one system), each under /usr/bin/time -v where it exists (else
    os.wait4's rusage); returns [(rc, stdout, stderr, max_rss_bytes or None)]."""
    use_time = os.access(TIME, os.X_OK)
    procs = []
    for cmd, env in zip(cmds, envs):
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        full = ([TIME, "-v"] if use_time else []) + cmd
        # A session of its own, so that a timeout ends the whole tree (time, python, its writer processes).
        procs.append((subprocess.Popen(full, stdout=out, stderr=err, text=True, env=env, start_new_session=True), out,
                      err))
    deadline = time.monotonic() + timeout
    status = {}  # index -> (returncode, rss from wait4)
    killed = False

    def kill_all():
        for q, _, _ in procs:  # the other ranks of a collective would wait for a dead one forever
            try:
                os.killpg(q.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    while len(status) < len(procs):
        for i, (p, _, _) in enumerate(procs):
            if i in status:
                continue
            pid, st, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                status[i] = (os.waitstatus_to_exitcode(st), usage.ru_maxrss * 1024)
                if status[i][0] != 0 and not killed:
                    kill_all()
                    killed = True
        if len(status) < len(procs) and time.monotonic() > deadline and not killed:
            kill_all()
            killed = "timeout"
        time.sleep(0.05)
    results = []
    for i, (p, out, err) in enumerate(procs):
        rc, rss = status[i]
        if killed == "timeout" and rc != 0:
            rc = 124
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close()
        err.close()
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
        if m:
            rss = int(m.group(1)) * 1024
        results.append((rc, stdout, stderr, rss))
    return results


def why(rc, stdout, stderr):
    """A short reason for a failed process."""
    for line in stdout.splitlines():
        if line.startswith("{") and '"error"' in line:
            return json.loads(line)["error"][:300]
    lines = [l for l in stderr.splitlines() if l.strip() and not l.startswith("\t") and "Command exited" not in l
             and "Command terminated" not in l]
    errs = [l for l in lines if re.search(r"Error|error|Exception|Traceback|not found|No such", l)]
    msg = (errs[-1] if errs else (lines[-1] if lines else "no output")).strip()
    return ("timed out; " if rc == 124 else "exit %d: " % rc) + msg[:300]


def json_lines(stdout):
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def clean(path):
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=False)


# --------------------------------------------------------------------------------------------- systems

class Bench:
    """What the stagehand-bench binary offers (its --help), read when first needed; waits for the binary while
    another engineer's rebuild replaces it."""

    def __init__(self, path):
        self.path = path
        self._source = None
        self._load = None

    def wait(self, patience=180):
        t0 = time.monotonic()
        while not os.access(self.path, os.X_OK):
            if time.monotonic() - t0 > patience:
                return False
            print(json.dumps({"waiting_for": self.path}), flush=True)
            time.sleep(10)
        return True

    def help(self, *sub):
        if not self.wait():
            return ""
        for _ in range(3):
            proc = subprocess.run([self.path, *sub, "--help"], capture_output=True, text=True)
            if proc.returncode == 0:
                return proc.stdout
            time.sleep(5)
        return ""

    def has_source(self):
        if self._source is None:
            self._source = "--source" in self.help("save")
        return self._source

    def has_load(self):
        if self._load is None:
            self._load = bool(re.search(r"^\s+load\b", self.help(), re.M))
        return self._load


def python_peer(args, system, directory):
    """(commands, envs, state bytes of all ranks) for a Python peer system."""
    local = peer_common.state_bytes(peer_common.parse_size(args.bytes_per_rank), args.tensors)
    common = ["--dir", directory, "--bytes-per-rank", args.bytes_per_rank, "--tensors", str(args.tensors),
              "--threads", str(args.thread_count), "--saves", str(args.repeat)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.ranks), GLOO_SOCKET_IFNAME="lo")
    if system.startswith("raw_"):
        specs = peer_common.tensor_specs(peer_common.parse_size(args.bytes_per_rank), args.tensors)
        written = sum(r * c * dict(peer_common.DTYPES)[d] * (1 if rep else args.ranks) for _, d, r, c, rep in specs)
        streams = 1 if system == "raw_write1" else args.ranks * args.thread_count
        cmd = [sys.executable, os.path.join(PEERS, "raw_peer.py"), "--mode", "read" if system == "raw_readT" else "write",
               "--dir", directory, "--bytes", str(written), "--state-bytes", str(written), "--streams", str(streams),
               "--saves", str(args.repeat)]
        return [cmd], [dict(env, RANK="0", WORLD_SIZE="1")], written
    if system in SPMD:  # the same ranks as DCP's, one process each, on Stagehand's control port
        peer = os.path.join(os.path.dirname(args.bench), "stagehand-spmd-peer")
        cmds = [[peer, "--mode", SPMD[system], *common] for _ in range(args.ranks)]
        port = str(free_port())
        envs = [dict(env, RANK=str(r), STAGEHAND_PORT=port) for r in range(args.ranks)]
        return cmds, envs, local * args.ranks
    py = venv_python(args)
    if system == "megatron_save":
        script = [os.path.join(PEERS, "megatron_peer.py")]
    else:
        script = [os.path.join(PEERS, "dcp_peer.py"), "--mode", {"dcp_save": "save", "dcp_async": "async",
                                                                 "dcp_load": "load"}[system]]
    cmds = [[py, *script, *common] for _ in range(args.ranks)]
    envs = [dict(env, RANK=str(r)) for r in range(args.ranks)]
    return cmds, envs, local * args.ranks


def run_python_peer(args, system, directory):
    if system in SPMD and not os.access(os.path.join(os.path.dirname(args.bench), "stagehand-spmd-peer"), os.X_OK):
        return None, "no stagehand-spmd-peer beside %s" % args.bench
    if not system.startswith("raw_") and system not in SPMD and not os.access(venv_python(args), os.X_OK):
        return None, "no venv at %s: run with --setup" % args.venv
    cmds, envs, state = python_peer(args, system, directory)
    results = run_processes(cmds, envs, args.timeout)
    failed = [r for r in results if r[0] != 0]
    if failed:  # the rank that failed on its own, not the ones killed after it
        rc, stdout, stderr, _ = ([r for r in failed if r[0] not in (-signal.SIGKILL, 124)] or failed)[0]
        return None, why(rc, stdout, stderr)
    by_pos, pre = {}, 0
    for _, stdout, _, _ in results:
        for line in json_lines(stdout):
            if line.get("kind") == "info":
                pre += line["pre_rss"]
            elif line.get("kind") in ("save", "load"):
                key = (line["pos"], line.get("cold"))
                cur = by_pos.setdefault(key, dict(line))
                for k in ("save_s", "block_s", "load_s"):  # a collective save lasts as long as its slowest rank
                    if k in line:
                        cur[k] = max(cur[k], line[k])
    if not by_pos:
        return None, "no timings in the output"
    peaks = [rss for _, _, _, rss in results]
    rss = None if None in peaks else {"peak_minus_state": sum(peaks) - state, "peak_minus_pre": sum(peaks) - pre}
    return {"records": list(by_pos.values()), "rss": rss}, None


def run_stagehand(args, bench, system, directory):
    if not bench.wait():
        return None, "no stagehand-bench at %s" % bench.path
    local = peer_common.state_bytes(peer_common.parse_size(args.bytes_per_rank), args.tensors)
    source = ("--source", "host") if bench.has_source() else ()
    if system.startswith("stagehand_load"):
        if not bench.has_load():
            return None, "stagehand-bench has no `load` subcommand (yet)"
        prep = subprocess.run(bench_common.save_command(args, directory, 1, *source, "--staging-buckets", "0"),
                              capture_output=True, text=True, timeout=args.timeout)
        if prep.returncode != 0:
            return None, "the save before the load failed: " + why(prep.returncode, prep.stdout, prep.stderr)
        cmd = [bench.path, "load", "--out", directory, "--ranks", str(args.ranks), "--bytes-per-rank",
               args.bytes_per_rank, "--tensors", str(args.tensors), "--thread-count",
               str(args.thread_count), "--repeat", str(args.repeat)] + (["--cold"] if system == "stagehand_load" else [])
    else:
        flags = {"stagehand_s0": (*source, "--staging-buckets", "0"),
                 "stagehand_s2": (*source, "--staging-buckets", "2"),
                 "stagehand_nowb": (*source, "--staging-buckets", "0", "--no-early-writeback"),
                 "stagehand_async": (*source, "--async", "--staging-buckets", "0"),
                 "stagehand_dev_s0": ("--source", "device", "--staging-buckets", "0"),
                 "stagehand_dev_s2": ("--source", "device", "--staging-buckets", "2")}[
                     system.removesuffix("_reuse").removesuffix("_cached")]
        if system.endswith("_reuse"):
            flags = (*flags, "--reuse-files")
        if system.endswith("_cached"):
            flags = (*flags, "--cached")
        if system.startswith("stagehand_dev") and not bench.has_source():
            return None, "stagehand-bench save has no --source (yet)"
        cmd = bench_common.save_command(args, directory, args.repeat, *flags)
    [(rc, stdout, stderr, peak)] = run_processes([cmd], [dict(os.environ)], args.timeout)
    if rc != 0:
        return None, why(rc, stdout, stderr)
    records = []
    cold = system == "stagehand_load"
    for i, line in enumerate(l for l in bench_common.save_lines(stdout) if "save_s" in l or "load_s" in l):
        rec = {"pos": line.get("repeat", i) + 1, "cold": cold if "load_s" in line else None}
        if "load_s" in line:
            rec["load_s"] = line["load_s"]
            if "raw_read_s" in line:
                rec["raw_read_s"] = line["raw_read_s"]
        else:
            rec["save_s"] = line["save_s"]
            if system.startswith("stagehand_async"):
                rec["block_s"] = line["stall_s"]
        records.append(rec)
    if not records:
        return None, "no timings in the output"
    rss = None if peak is None else {"peak_minus_state": peak - local * args.ranks, "peak_minus_pre": None}
    return {"records": records, "rss": rss}, None


# -------------------------------------------------------------------------------------------- reporting

def pos_label(pos):
    return str(pos) if pos <= 2 else "3+"


def fmt(x, digits=3):
    return "-" if x is None else ("%.*f" % (digits, x))


def mib(x):
    return "-" if x is None else "%d" % round(x / (1 << 20))


def stats(values):
    return (statistics.median(values), min(values), max(values)) if values else None


def cell(st):
    return "-" if st is None else "%.3f (%.3f-%.3f)" % st


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


class Results:
    def __init__(self):
        self.records, self.rss, self.errors, self.ok = {}, {}, {}, {}

    def add(self, system, rnd, result, error):
        if error:
            self.errors.setdefault(system, []).append("round %d: %s" % (rnd, error))
            return
        self.ok[system] = self.ok.get(system, 0) + 1
        for r in result["records"]:
            self.records.setdefault(system, []).append(dict(r, round=rnd))
        if result["rss"]:
            self.rss.setdefault(system, []).append(result["rss"])

    def values(self, system, key, label=None, cold=None):
        return [r[key] for r in self.records.get(system, []) if key in r and r[key] is not None
                and (label is None or pos_label(r["pos"]) == label) and (cold is None or r.get("cold") == cold)]

    def med(self, system, key, label=None, cold=None):
        v = self.values(system, key, label, cold)
        return statistics.median(v) if v else None

    def labels(self, system, key, cold=None):
        return sorted({pos_label(r["pos"]) for r in self.records.get(system, []) if key in r
                       and (cold is None or r.get("cold") == cold)}, key=lambda s: (len(s), s))

    def rss_cells(self, system):
        rss = self.rss.get(system)
        if not rss:
            return "-", "-"
        a = [x["peak_minus_state"] for x in rss]
        b = [x["peak_minus_pre"] for x in rss if x["peak_minus_pre"] is not None]
        return mib(statistics.median(a)), (mib(statistics.median(b)) if b else "-")

    def failed_row(self, system, width):
        errs = self.errors.get(system, [])
        return "| %s | failed: %s |%s" % (system, errs[-1].replace("|", "/") if errs else "not run", " |" * (width - 2))


def report(args, res, systems):
    out = []
    T = args.thread_count
    out.append("Same bytes: %d rank(s) x %s in %d tensors (stagehand-bench's synthetic state), %d threads, "
               "%d round(s), %d save(s)/load(s) per process. Times in s: median (min-max) over rounds, by position "
               "in the process." % (args.ranks, args.bytes_per_rank, args.tensors, T, args.rounds, args.repeat))
    best_raw = min((res.med("raw_writeT", "save_s", l) for l in res.labels("raw_writeT", "save_s")), default=None)
    out.append("")
    out.append("### Save (sync; for async rows: until the checkpoint is complete)")
    out.append("")
    out.append("| system | save | n | seconds | / DCP same save | raw %d-stream / this (same save) | best raw %d-stream / "
               "this | peak RSS - state MiB | peak RSS - pre-save MiB |" % (args.ranks * T, args.ranks * T))
    out.append("|---|---|---|---|---|---|---|---|---|")
    save_systems = [s for s in systems if s not in ("raw_readT", "dcp_load", "stagehand_spmd_load")
                    and not s.startswith("stagehand_load")]
    for s in save_systems:
        labels = res.labels(s, "save_s")
        if not labels:
            out.append(res.failed_row(s, 9))
            continue
        rss_a, rss_b = res.rss_cells(s)
        for i, l in enumerate(labels):
            m = res.med(s, "save_s", l)
            out.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s |" % (
                s, l, len(res.values(s, "save_s", l)), cell(stats(res.values(s, "save_s", l))),
                fmt(ratio(m, res.med("dcp_save", "save_s", l)), 2),
                fmt(ratio(res.med("raw_writeT", "save_s", l), m), 2), fmt(ratio(best_raw, m), 2),
                rss_a if i == 0 else "", rss_b if i == 0 else ""))
    # Stability: over saves 3+ of a process (all rounds), the slowest against the median.
    stable = []
    for s in save_systems:
        later = [r["save_s"] for r in res.records.get(s, []) if "save_s" in r and r["pos"] >= 3]
        if len(later) >= 2:
            stable.append("%s: %s" % (s, fmt(max(later) / statistics.median(later), 2)))
    if stable:
        out.append("")
        out.append("Stability, slowest / median of saves 3+ (all rounds): " + ", ".join(stable))
    # The same within each process (a save's time is its slowest rank's), then the median and the
    # largest over the processes: the drift of the machine between rounds left out.
    within = []
    for s in save_systems:
        ratios = []
        for rnd in sorted({r["round"] for r in res.records.get(s, [])}):
            by_pos = {}
            for r in res.records[s]:
                if r["round"] == rnd and "save_s" in r and r["pos"] >= 3:
                    by_pos[r["pos"]] = max(by_pos.get(r["pos"], 0.0), r["save_s"])
            if len(by_pos) >= 2:
                ratios.append(max(by_pos.values()) / statistics.median(by_pos.values()))
        if ratios:
            within.append("%s: %s (%s)" % (s, fmt(statistics.median(ratios), 2), fmt(max(ratios), 2)))
    if within:
        out.append("Stability within each process, slowest / median of saves 3+, median over the processes "
                   "(largest): " + ", ".join(within))
    if "stagehand_dev_s0" in systems and "stagehand_dev_s2" in systems:
        labels = res.labels("stagehand_dev_s2", "save_s")
        if labels:
            out.append("")
            out.append("Staged save (--source device), staging 2 / staging 0, by save: " + ", ".join(
                "%s: %s" % (l, fmt(ratio(res.med("stagehand_dev_s2", "save_s", l), res.med("stagehand_dev_s0", "save_s", l)),
                                   2)) for l in labels))
    if any(s in systems for s in ("dcp_async", "stagehand_async", "stagehand_async_reuse", "stagehand_async_cached",
                                  "stagehand_spmd_async")):
        out.append("")
        out.append("### Async: blocking part (DCP: async_save's return; stagehand: stall_s)")
        out.append("")
        out.append("| system | save | n | blocking s | / DCP async blocking | total s | / DCP async total |")
        out.append("|---|---|---|---|---|---|---|")
        for s in ("dcp_async", "stagehand_async", "stagehand_async_reuse", "stagehand_async_cached",
                  "stagehand_spmd_async"):
            if s not in systems:
                continue
            labels = res.labels(s, "block_s")
            if not labels:
                out.append(res.failed_row(s, 7))
                continue
            for l in labels:
                b, t = res.med(s, "block_s", l), res.med(s, "save_s", l)
                out.append("| %s | %s | %d | %s | %s | %s | %s |" % (
                    s, l, len(res.values(s, "block_s", l)), cell(stats(res.values(s, "block_s", l))),
                    fmt(ratio(b, res.med("dcp_async", "block_s", l)), 2), cell(stats(res.values(s, "save_s", l))),
                    fmt(ratio(t, res.med("dcp_async", "save_s", l)), 2)))
    load_systems = [s for s in systems if s in ("raw_readT", "dcp_load", "stagehand_spmd_load")
                    or s.startswith("stagehand_load")]
    if load_systems:
        out.append("")
        out.append("### Load (cold: files dropped from the page cache first)")
        out.append("")
        out.append("| system | cold/warm | n | seconds | / DCP load same kind | raw %d-thread cold read / this | "
                   "peak RSS - state MiB | peak RSS - pre MiB |" % (args.ranks * T))
        out.append("|---|---|---|---|---|---|---|---|")
        raw_read = res.med("raw_readT", "load_s", cold=True)
        for s in load_systems:
            kinds = [c for c in (True, False) if res.values(s, "load_s", cold=c)]
            if not kinds:
                out.append(res.failed_row(s, 8))
                continue
            rss_a, rss_b = res.rss_cells(s)
            for i, c in enumerate(kinds):
                m = res.med(s, "load_s", cold=c)
                out.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                    s, "cold" if c else "warm", len(res.values(s, "load_s", cold=c)),
                    cell(stats(res.values(s, "load_s", cold=c))), fmt(ratio(m, res.med("dcp_load", "load_s", cold=c)), 2),
                    fmt(ratio(raw_read, m), 2) if c else "-", rss_a if i == 0 else "", rss_b if i == 0 else ""))
            own_raw = res.values(s, "raw_read_s")
            if own_raw:
                out.append("| %s (its own raw_read_s) | | %d | %s | | | | |" % (s, len(own_raw), cell(stats(own_raw))))
    failed = {s: e for s, e in res.errors.items() if s in res.ok}
    if failed:
        out.append("")
        out.append("Failures in some rounds: " + "; ".join("%s: %s" % (s, " / ".join(e)) for s, e in failed.items()))
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------- main

def in_process(argv):
    """--in-process: runs bench/compare_python.py (the flags after --in-process but --venv) under the
    peers' Python, with the package built into build/python unless PYTHONPATH is set."""
    venv = "/work/peers-venv"
    rest = []
    it = iter(argv)
    for a in it:
        if a == "--in-process":
            continue
        if a == "--venv":
            venv = next(it)
        elif a.startswith("--venv="):
            venv = a.split("=", 1)[1]
        else:
            rest.append(a)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        sys.exit("--in-process needs torch in --venv (%s): run bench/compare_peers.py --setup first" % venv)
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(os.path.dirname(HERE), "build", "python"))
    script = os.path.join(HERE, "compare_python.py")
    os.execve(python, [python, script] + rest, env)


def main():
    if "--in-process" in sys.argv[1:]:
        return in_process(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", action="store_true", help="create --venv and install torch, megatron-core, numpy; exit")
    p.add_argument("--venv", default="/work/peers-venv")
    p.add_argument("--torch-spec", default="torch", help="pip requirement for torch (installed --no-deps)")
    p.add_argument("--megatron-spec", default="megatron-core", help="pip requirement for megatron-core (--no-deps)")
    p.add_argument("--bench", default=os.path.join(os.path.dirname(HERE), "build", "bin", "stagehand-bench"))
    p.add_argument("--out-dir", "--out", dest="out", default="/tmp/stagehand-peers", help="scratch folder, local disk")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--bytes-per-rank", default=None, help="default 1G (64M with --quick)")
    p.add_argument("--tensors", type=int, default=32)
    p.add_argument("--threads", "--thread-count", dest="thread_count", type=int, default=8)
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--saves-per-process", "--repeat", dest="repeat", type=int, default=None,
                   help="saves (loads) per process, default 2")
    p.add_argument("--systems", default=",".join(ALL), help="comma-separated subset of: " + ",".join(ALL))
    p.add_argument("--order", choices=["shuffle", "same"], default="shuffle", help="order of rounds after the first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=int, default=900, help="seconds per process")
    p.add_argument("--quick", action="store_true", help="smoke run: 64M per rank, 1 round, 2 saves per process")
    p.add_argument("--markdown", help="also write the table to this file")
    args = p.parse_args()
    if args.setup:
        return setup(args)
    args.bytes_per_rank = args.bytes_per_rank or ("64M" if args.quick else "1G")
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.repeat = args.repeat or 2
    args.bench = os.path.abspath(args.bench)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in ALL]
    if unknown:
        p.error("unknown systems: %s" % ",".join(unknown))
    bench = Bench(args.bench)
    if any(s.startswith("stagehand") for s in systems):
        optional = {"stagehand_dev_s0": bench.has_source, "stagehand_dev_s2": bench.has_source,
                    "stagehand_load": bench.has_load, "stagehand_load_warm": bench.has_load}
        absent = [s for s in systems if s in optional and not optional[s]()]
        if absent:
            print(json.dumps({"skipped": absent, "why": "stagehand-bench does not offer them (yet)"}), flush=True)
            systems = [s for s in systems if s not in absent]
    print(json.dumps({"systems": systems, "ranks": args.ranks, "bytes_per_rank": args.bytes_per_rank,
                      "tensors": args.tensors, "threads": args.thread_count, "rounds": args.rounds,
                      "saves_per_process": args.repeat, "bench": args.bench, "venv": args.venv,
                      "bench_source_flag": bench.has_source() if any(s.startswith("stagehand") for s in systems)
                      else None}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    res = Results()
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        order = list(systems)
        if r > 0 and args.order == "shuffle":
            rng.shuffle(order)
        for s in order:
            if s in res.errors and s not in res.ok:
                continue  # failed before and never worked: reported once, not retried every round
            directory = os.path.join(args.out, s)
            clean(directory)
            t0 = time.monotonic()
            try:
                if s.startswith("stagehand") and s not in SPMD:
                    result, error = run_stagehand(args, bench, s, directory)
                else:
                    result, error = run_python_peer(args, s, directory)
            except Exception as e:  # a broken system is a row, not the end of the run
                result, error = None, "%s: %s" % (type(e).__name__, e)
            clean(directory)
            res.add(s, r, result, error)
            print(json.dumps({"round": r, "system": s, "wall_s": round(time.monotonic() - t0, 2), "error": error,
                              **(result or {})}), flush=True)
    for s in systems:
        shutil.rmtree(os.path.join(args.out, s), ignore_errors=True)
    try:
        os.rmdir(args.out)
    except OSError:
        pass
    table = report(args, res, systems)
    print()
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
