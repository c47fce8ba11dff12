#!/usr/bin/env python3
"""Draw the plots of docs/benchmarks.md from the figures in bench/results/*.json.

    pip install matplotlib                 # once (or: python3 -m pip install matplotlib)
    python3 bench/plot_benchmarks.py       # writes docs/benchmarks/*.png

Every bench/results/*.json is read. Each holds one benchmark's figures of one day with the
command, date and machine that gave them ("benchmark", "date", "machine", "command",
"figures"); the files present now were transcribed from docs/benchmarks/log.md (their
"source" field says from which section), not written by the benches. A plot takes the newest
file of its benchmark (by "date") that has the figures it draws; a benchmark with no file is
skipped, with a line on stderr. Options: --results DIR (default bench/results), --out DIR
(default docs/benchmarks).

Plots written:
  compare_python.png   stagehand / DCP in one Python process, by position: sync save, async
                       blocking part, cold load, every run of the day, the targets as lines
  compare_peers.png    stagehand / DCP save by position (one process per rank) and the
                       steadiness of saves 3+ (slowest / median), with the targets
  physical_limits.png  limit / stagehand for loads, saves and the async stall, 1 and 2 ranks,
                       the newest run and the one before it, with the targets
  steps_per_second.png training steps per second with saves / without, async saves every 10
                       steps (interference.py) and local saves every step (tiers.py), target
  scale_curve.png      commit time and the load's metadata read against the number of ranks
  many_tensors.png     save time and extra RSS against the tensor count (1 to 100k), Stagehand
                       beside DCP, from bench/many_tensors.py --json (many_tensors_DATE.json)
"""

import argparse
import glob
import json
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_STYLE = dict(color="crimson", linestyle="--", linewidth=1.5)


def load_results(folder):
    by_bench = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        doc["_path"] = path
        by_bench.setdefault(doc.get("benchmark", os.path.basename(path)), []).append(doc)
    return by_bench


def newest(by_bench, bench, has=lambda d: True):
    docs = [d for d in by_bench.get(bench, []) if has(d)]
    if not docs:
        print(f"plot_benchmarks: no {bench} results with the figures needed; skipped", file=sys.stderr)
        return None
    return max(docs, key=lambda d: d["date"])


def caption(doc):
    text = textwrap.fill(f"{doc['date']}, {doc['machine']}", 150)
    return f"{text}\nfrom {os.path.relpath(doc['_path'], ROOT)} (transcribed from docs/benchmarks/log.md)"


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(path)


def plot_compare_python(by_bench, out):
    doc = newest(by_bench, "compare_python", lambda d: "runs" in d["figures"])
    if doc is None:
        return
    ops = [("sync_save", "sync save"), ("async_blocking", "async save, blocking part"), ("cold_load", "cold load")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharey=True)
    markers = "osD^v"
    for ax, (key, title) in zip(axes, ops):
        for i, run in enumerate(doc["figures"]["runs"]):
            ys = run[key]
            name = run["run"] if run["run"].startswith("--") else f"run {run['run']}"
            ax.plot(range(1, len(ys) + 1), ys, marker=markers[i % len(markers)], label=name)
        target = doc["targets"][key]
        ax.axhline(target, **TARGET_STYLE, label="target (at most)")
        ax.text(5.2, target + 0.015, f"target {target}", color="crimson", ha="right", va="bottom", fontsize=9)
        ax.set_title(title)
        ax.set_xlabel("position in the process")
        ax.set_xticks(range(1, 6))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("stagehand / DCP time (lower is better)")
    axes[0].set_ylim(0, 1.1)
    axes[2].legend(loc="lower right", fontsize=8)
    fig.suptitle("Python, one process: stagehand / DCP, median over 4 processes per position")
    fig.text(0.01, -0.06, caption(doc), fontsize=8)
    save(fig, out, "compare_python.png")


def plot_compare_peers(by_bench, out):
    doc = newest(by_bench, "compare_peers",
                 lambda d: "runs" in d["figures"] and all("arms" in r for r in d["figures"]["runs"]))
    if doc is None:
        return
    runs = doc["figures"]["runs"]
    last = runs[-1]
    arms = [a for a in last["arms"] if a != "DCP save"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [1.3, 1]})

    positions = ["save 1", "save 2", "saves 3+"]
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [p + (i - (len(arms) - 1) / 2) * width for p in range(len(positions))]
        ax1.bar(xs, last["arms"][arm]["over_dcp"], width, label=f"{arm} (run {last['run']})")
        for run in runs[:-1]:
            if arm in run["arms"]:
                ax1.plot(xs, run["arms"][arm]["over_dcp"], "k.", markersize=6)
    ax1.plot([], [], "k.", label="the same arm in the day's earlier runs")
    target = doc["target"]["sync_save_over_dcp_every_position"]
    ax1.axhline(target, **TARGET_STYLE, label=f"target: sync save at most {target}x DCP")
    ax1.set_xticks(range(len(positions)))
    ax1.set_xticklabels(positions)
    ax1.set_ylabel("stagehand / DCP save time (lower is better)")
    ax1.set_ylim(0, 1.0)
    ax1.set_title("save time against DCP, by position in the process")
    ax1.legend(fontsize=7, loc="upper left")
    ax1.grid(axis="y", alpha=0.3)

    names = arms + ["DCP save"]
    width = 0.8 / len(runs)
    for j, run in enumerate(runs):
        xs, ys = [], []
        for i, arm in enumerate(names):
            if arm in run["arms"]:
                xs.append(i + (j - (len(runs) - 1) / 2) * width)
                ys.append(run["arms"][arm]["within_a_process"])
        ax2.bar(xs, ys, width, label=f"run {run['run']}")
    limit = doc["target"]["slowest_over_median_saves_3_plus"]
    ax2.axhline(limit, **TARGET_STYLE, label=f"target: at most {limit} (and at most DCP's)")
    ax2.set_xticks(range(len(names)))
    ax2.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax2.set_ylim(0.9, 1.4)
    ax2.set_ylabel("slowest / median of saves 3+ (lower is steadier)")
    ax2.set_title("steadiness within a process (median over processes)")
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle("Against DCP, each in its own processes (bench/compare_peers.py), 1 rank x 1 GiB, "
                 "data files written around the page cache; async arms until committed")
    fig.text(0.01, -0.2, caption(doc), fontsize=8)
    save(fig, out, "compare_peers.png")


def plot_physical_limits(by_bench, out):
    docs = sorted((d for d in by_bench.get("physical_limits", [])
                   if "rows" in d["figures"] or "rows" in d["figures"].get("newest", {})),
                  key=lambda d: d["date"])[-2:]
    if not docs:
        print("plot_benchmarks: no physical_limits results; skipped", file=sys.stderr)
        return
    series = []
    for d in reversed(docs):
        rows = d["figures"]["newest"]["rows"] if "newest" in d["figures"] else d["figures"]["rows"]
        for ranks in ("1 rank", "2 ranks"):
            series.append((f"{d['date']}, {ranks}", {r["figure"]: r[ranks] for r in rows}))
    figures = []
    for _, vals in series:
        figures += [f for f in vals if f not in figures]
    targets = {"warm load / warm read": 0.7, "cold load / cold read": 0.9,
               "async stall, first save / memcpy of the state": 1 / 1.2,
               "async stall, saves 2-3 / memcpy of the state": 1 / 1.2}
    fig, ax = plt.subplots(figsize=(11, 7))
    height = 0.8 / len(series)
    for i, (label, vals) in enumerate(series):
        ys = [k + (i - (len(series) - 1) / 2) * height for k, f in enumerate(figures) if f in vals]
        xs = [vals[f] for f in figures if f in vals]
        ax.barh(ys, xs, height, label=label, hatch="//" if i >= 2 else None, alpha=0.9 if i < 2 else 0.6)
    for k, f in enumerate(figures):
        if f in targets:
            ax.plot([targets[f]] * 2, [k - 0.45, k + 0.45], color="crimson", linewidth=2.5)
    ax.plot([], [], color="crimson", linewidth=2.5,
            label="target (at least): loads 0.7 warm, 0.9 cold;\nstall 1/1.2, the 1.2x + 5 ms target\nwithout its 5 ms")
    ax.axvline(1.0, color="black", linewidth=1, label="at the limit (1.0)")
    ax.set_yticks(range(len(figures)))
    ax.set_yticklabels(figures, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("limit time / stagehand time (higher is better; above 1.0: faster than the limit)")
    ax.set_xlim(0, 1.7)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("Physical limits (bench/physical_limits.py): 1 GiB per rank, 8 threads")
    fig.text(0.01, -0.04, "\n".join(caption(d) for d in reversed(docs)), fontsize=7)
    save(fig, out, "physical_limits.png")


def plot_steps(by_bench, out):
    inter = newest(by_bench, "interference", lambda d: "runs" in d["figures"])
    tiers = newest(by_bench, "tiers", lambda d: "arms" in d["figures"])
    if inter is None and tiers is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    if inter is not None:
        runs = inter["figures"]["runs"]
        labels = [f"{r['steps']} steps\n{'around the cache' if r['writes'].startswith('around') else 'cached'}"
                  + ("\n(earlier run)" if "earlier" in r["writes"] else "") for r in runs]
        for j, arm in enumerate(["staging 0", "staging 2 of 8"]):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(runs))]
            ax1.bar(xs, [r[arm] for r in runs], 0.38, label=arm)
        ax1.axhline(inter["target"], **TARGET_STYLE, label=f"target {inter['target']}")
        ax1.set_xticks(range(len(runs)))
        ax1.set_xticklabels(labels, fontsize=8)
        ax1.set_ylim(0.85, 1.05)
        ax1.set_ylabel("steps/s with saves / without (median over rounds)")
        ax1.set_title("async saves every 10 steps (bench/interference.py), " + inter["date"])
        ax1.legend(fontsize=8, loc="upper center", ncol=3)
        ax1.grid(axis="y", alpha=0.3)
    if tiers is not None:
        arms = tiers["figures"]["arms"]
        ax2.bar(range(len(arms)), [a["median"] for a in arms.values()], 0.5, color="tab:green")
        ax2.axhline(tiers["target"], **TARGET_STYLE, label=f"target {tiers['target']}")
        ax2.set_xticks(range(len(arms)))
        ax2.set_xticklabels(list(arms), fontsize=8)
        ax2.set_ylim(0.85, 1.05)
        ax2.set_title("local saves every step (bench/tiers.py), " + tiers["date"])
        ax2.legend(fontsize=8, loc="upper center")
        ax2.grid(axis="y", alpha=0.3)
    fig.suptitle("Training steps per second with checkpoints against none (stagehand-train, 2 cores)")
    fig.text(0.01, -0.2, "\n".join(caption(d) for d in (inter, tiers) if d is not None), fontsize=7)
    save(fig, out, "steps_per_second.png")


def plot_scale_curve(by_bench, out):
    doc = newest(by_bench, "scale_curve", lambda d: "ranks" in d["figures"])
    if doc is None:
        return
    f = doc["figures"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.loglog(f["ranks"], f["commit_s"], "o-", label="commit_s, inside the save")
    ax1.loglog(f["ranks"], f["commit_alone_s"], "s-", label="commit alone")
    ax1.loglog(f["ranks"], f["commit_s_before_the_gather_changes"], "^--", label="commit_s before the gather changes")
    ax1.set_xlabel("ranks")
    ax1.set_ylabel("seconds")
    ax1.set_title("commit (gather reports, metadata.json, renames, tracker)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, which="both")
    ax2.loglog(f["ranks"], f["all_ranks_s"], "o-", label="every rank reading its part (now)")
    ax2.loglog(f["ranks"], f["before_parts_all_ranks_s"], "^--", label="every rank reading the whole file (before)")
    ax2.set_xlabel("ranks")
    ax2.set_ylabel("seconds, all ranks")
    ax2.set_title("a load's metadata.json read")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, which="both")
    fig.suptitle("Commit and metadata.json at many ranks (bench/scale_curve.py)")
    fig.text(0.01, -0.08, caption(doc), fontsize=8)
    save(fig, out, "scale_curve.png")


def plot_many_tensors(by_bench, out):
    """Save time and extra RSS against the tensor count, Stagehand beside DCP (its JSON is written
    by bench/many_tensors.py --json, named many_tensors_DATE.json)."""
    docs = [d for name, ds in by_bench.items() if name.startswith("many_tensors") for d in ds if "medians" in d]
    if not docs:
        print("plot_benchmarks: no many_tensors results; skipped", file=sys.stderr)
        return
    doc = max(docs, key=lambda d: d["date"])
    counts = sorted(int(c) for c in doc["medians"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for system, style in (("stagehand", "o-"), ("dcp", "s--")):
        have = [c for c in counts if system in doc["medians"][str(c)]]
        ax1.loglog(have, [doc["medians"][str(c)][system]["save_s"] for c in have], style, label=system)
        ax2.loglog(have, [max(doc["medians"][str(c)][system]["extra_mib"], 0.1) for c in have], style, label=system)
    ax2.axhline(100, **TARGET_STYLE, label="target at 100k: 100 MiB")
    ax1.set_title("one sync save of 1 GiB: seconds")
    ax2.set_title("extra RSS during the save: MiB")
    for ax in (ax1, ax2):
        ax.set_xlabel("tensors")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Many tensors, beside DCP (bench/many_tensors.py)")
    fig.text(0.01, -0.08, f"{doc['date']}, medians of {doc['rounds']} interleaved rounds\n"
             f"from {os.path.relpath(doc['_path'], ROOT)}: {doc['command']}", fontsize=8)
    save(fig, out, "many_tensors.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    by_bench = load_results(args.results)
    for plot in (plot_compare_python, plot_compare_peers, plot_physical_limits, plot_steps, plot_scale_curve,
                 plot_many_tensors):
        plot(by_bench, args.out)


if __name__ == "__main__":
    main()
