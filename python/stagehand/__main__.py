"""``python -m stagehand verify PATH``: checks a checkpoint as ``stagehand-ckpt verify`` does (the
metadata and headers as a load reads them, every file and chunk checksum). PATH is a checkpoint
root (the step its tracker names) or one ``global_step_N`` folder, local or ``s3://``/``gs://``.
Exits 0 when it verifies, 1 when it does not, 2 when it cannot be checked."""

import argparse
import sys

from . import Error, verify


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stagehand", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="check every file and chunk of a checkpoint")
    check.add_argument("path")
    args = parser.parse_args(argv)
    try:
        report = verify(args.path)
    except Error as e:
        print(f"python -m stagehand verify: {e}", file=sys.stderr)
        return 2
    for problem in report["problems"]:
        print(f"problem: {problem}")
    state = "OK" if report["ok"] else "FAILED"
    print(f"{state} {report['checkpoint']}: {report['files_checked']} files, {report['chunks_checked']} chunks, "
          f"{report['bytes_checked'] / 2**20:.1f} MiB checked, {len(report['problems'])} problems")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
