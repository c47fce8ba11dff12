"""``python -m stagehand {verify,inspect,export}``: the verbs of ``stagehand-ckpt``.

  verify PATH        checks a checkpoint (the metadata and headers as a load reads them, every
                     file and chunk checksum); exits 0 when it verifies, 1 when it does not, 2
                     when it cannot be checked
  inspect PATH       lists its tensors, shards, bytes, files and objects (--json: as JSON)
  export PATH OUT    writes its tensors in the Hugging Face layout into the new folder OUT

PATH is a checkpoint root (the step its tracker names) or one ``global_step_N`` folder, local or
``s3://``/``gs://`` (AWS_* variables)."""

import argparse
import json
import sys

from . import Error, export, inspect, verify


def _human(n: int) -> str:
    value, unit = float(n), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{value:.0f} {units[unit]}" if unit == 0 else f"{value:.1f} {units[unit]}"


def _verify(args) -> int:
    report = verify(args.path, progress=args.progress)
    for problem in report["problems"]:
        print(f"problem: {problem}")
    state = "OK" if report["ok"] else "FAILED"
    print(f"{state} {report['checkpoint']}: {report['files_checked']} files, {report['chunks_checked']} chunks, "
          f"{report['bytes_checked'] / 2**20:.1f} MiB checked, {len(report['problems'])} problems")
    return 0 if report["ok"] else 1


def _inspect(args) -> int:
    info = inspect(args.path)
    if args.json:
        json.dump(info, sys.stdout, indent=1)
        print()
        return 0
    print(f"checkpoint {info['checkpoint']} (step {info['step']})\n")
    print(f"{'tensor':40} {'dtype':5} {'global shape':20} {'shards':>6} {'bytes':>12}")
    for name, t in info["tensors"].items():
        shape = "[" + ", ".join(str(d) for d in t["global_shape"]) + "]"
        print(f"{name:40} {t['dtype']:5} {shape:20} {len(t['chunks']):>6} {_human(t['bytes']):>12}")
    print(f"\n{'file':40} {'size':>12} {'xxh3':>18}")
    for name, f in info["files"].items():
        print(f"{name:40} {_human(f['size']):>12} {f['xxh3']:>18}")
    tensor_bytes = sum(t["bytes"] for t in info["tensors"].values())
    file_bytes = sum(f["size"] for f in info["files"].values())
    print(f"\n{len(info['tensors'])} tensors, {_human(tensor_bytes)} of tensor data, {len(info['files'])} files, "
          f"{_human(file_bytes)} on disk, {len(info['objects'])} objects")
    for name, value in info["objects"].items():
        print(f"  object {name}: {len(value.encode())} bytes")
    return 0


def _export(args) -> int:
    dtype = None if args.dtype == "as-saved" else args.dtype
    report = export(args.path, args.out, what=args.what, dtype=dtype, max_shard_size=args.max_shard_size,
                    threads=args.threads, progress=args.progress)
    print(f"exported {report['tensors']} tensors, {_human(report['bytes'])}, into {len(report['files'])} files "
          f"in {args.out} in {report['total_s']:.2f} s")
    for name in report["files"]:
        print(f"  {name}")
    return 0


def _progress_option(command) -> None:
    command.add_argument("--progress", choices=["auto", "always", "never"], default="auto",
                         help="a progress line on stderr: auto (on a terminal, once the command has run a second), "
                              "always, or never")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stagehand", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="check every file and chunk of a checkpoint")
    check.add_argument("path")
    _progress_option(check)
    check.set_defaults(run=_verify)
    listing = commands.add_parser("inspect", help="list a checkpoint's tensors, shards, files and objects")
    listing.add_argument("path")
    listing.add_argument("--json", action="store_true", help="print what stagehand.inspect returns, as JSON")
    listing.set_defaults(run=_inspect)
    out = commands.add_parser("export", help="write the tensors in the Hugging Face layout")
    out.add_argument("path")
    out.add_argument("out", help="a new local folder (one that does not exist, or an empty one)")
    out.add_argument("--what", choices=["model", "all"], default="model",
                     help="model: the tensors named model.*; all: every tensor, optimizer state too")
    out.add_argument("--dtype", choices=["as-saved", "bf16", "fp32"], default="as-saved",
                     help="floating point tensors as saved, or converted (round to nearest even)")
    out.add_argument("--max-shard-size", default="5GiB", help="largest file: 5GB, 500MB, 2GiB, or bytes")
    out.add_argument("--threads", type=int, default=4, help="reads in flight at once (1 to 256)")
    _progress_option(out)
    out.set_defaults(run=_export)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError) as e:  # bad arguments
        print(f"python -m stagehand {args.command}: {e}", file=sys.stderr)
        return 2
    except Error as e:  # an export that failed (1, as stagehand-ckpt), a checkpoint that cannot be read (2)
        print(f"python -m stagehand {args.command}: {e}", file=sys.stderr)
        return 1 if args.command == "export" else 2


if __name__ == "__main__":
    sys.exit(main())
