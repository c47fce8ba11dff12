"""Peak memory of `stagehand-ckpt export` against the largest tensor and the whole checkpoint.

For each model.hidden, stagehand-train (sync RL, tensor 2 x data 2) trains one step and saves it;
then `/usr/bin/time -v stagehand-ckpt export` exports it, once the model's tensors (`--what
model`) and once everything (`--what all`, the F32 main weights and Adam moments too). The
largest tensor is model.fc1.weight's optimizer copies, [hidden, context_dim] in F32.

Usage: bench_export.py --bin BUILD/bin --out DIR [--hidden 65536,262144,524288] [--context-dim 256]
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20


def max_rss_bytes(time_output):
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_output)
    return int(match.group(1)) * 1024


def checkpoint_figures(ckpt):
    """Bytes of all tensors and of the largest one, for every tensor and for the model's, from
    metadata.json."""
    step = Path(ckpt, "latest_ckpt_global_step.txt").read_text().strip()
    metadata = json.loads(Path(ckpt, f"global_step_{step}", "policy", "metadata.json").read_text())
    sizes = {"F64": 8, "F32": 4, "I64": 8, "BF16": 2, "F16": 2}
    figures = {"all": [0, 0], "model": [0, 0]}
    for name, t in metadata["tensors"].items():
        n = sizes.get(t["dtype"], 1)
        for d in t["shape"]:
            n *= d
        for what in ("all", "model") if name.startswith("model.") else ("all",):
            figures[what][0] += n
            figures[what][1] = max(figures[what][1], n)
    return figures


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="folder with stagehand-train and stagehand-ckpt")
    p.add_argument("--out", required=True, help="scratch folder (emptied)")
    p.add_argument("--hidden", default="65536,262144,524288")
    p.add_argument("--context-dim", type=int, default=256)
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = Path(__file__).resolve().parent.parent / "examples" / "configs" / "sync_rl.yaml"
    print(f"{'hidden':>9} {'what':>5} {'dtype':>8} {'checkpoint':>11} {'exported':>9} {'largest':>9} {'max RSS':>9} "
          f"{'RSS/largest':>11} {'RSS/exported':>12} {'RSS/ckpt':>8} {'time':>7}")
    for hidden in (int(h) for h in args.hidden.split(",")):
        ckpt = out / f"ckpt-{hidden}"
        subprocess.run([f"{args.bin}/stagehand-train", "--quiet", "--config", str(config),
                        "--set", f"trainer.ckpt_path={ckpt}", "--set", "trainer.total_steps=1",
                        "--set", "trainer.ckpt_interval=1", "--set", f"model.hidden={hidden}",
                        "--set", f"model.context_dim={args.context_dim}",
                        "--set", "model.batch_size=64", "--set", "model.eval_contexts=64"],
                       check=True, capture_output=True)
        figures = checkpoint_figures(ckpt)
        total = figures["all"][0]
        for what, dtype in (("model", "as-saved"), ("all", "as-saved"), ("all", "bf16")):
            export = out / f"export-{hidden}-{what}-{dtype}"
            run = subprocess.run(["/usr/bin/time", "-v", f"{args.bin}/stagehand-ckpt", "export", str(ckpt),
                                  str(export), "--what", what, "--dtype", dtype],
                                 check=True, capture_output=True, text=True)
            rss = max_rss_bytes(run.stderr)
            largest = figures[what][1]
            exported = sum(f.stat().st_size for f in export.iterdir())
            seconds = float(re.search(r" in ([0-9.]+) s ", run.stdout).group(1))
            print(f"{hidden:>9} {what:>5} {dtype:>8} {total / MIB:>9.1f}Mi {exported / MIB:>7.1f}Mi {largest / MIB:>7.1f}Mi "
                  f"{rss / MIB:>7.1f}Mi {rss / largest:>11.2f} {rss / exported:>12.2f} {rss / total:>8.2f} "
                  f"{seconds:>6.2f}s")
            shutil.rmtree(export)
        shutil.rmtree(ckpt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
