#!/usr/bin/env python3
"""Checks that every library folder includes only its own layer and the layers before it, and
always under the project's prefix (`"stagehand/core/status.hpp"`, never a bare `"core/..."` that
could collide with a user's folder); that no library file is longer than 600 lines (one
responsibility a file); and that only storage/ (the file systems and their router) and config/
(the rule that names a cloud ckpt_path) know object-store URLs: everything else asks a
FileSystem's capabilities.

The layers, lowest first (docs/architecture.md "Code layout"; storage comes before config, whose
rules use storage's test of a URL). Programs (tools/, bench/,
examples/) and tests/ may include any layer. Prints each violation and exits 1 when there is one.

  scripts/check-layers.py [SOURCE_DIR]
"""
import os
import re
import sys

LAYERS = ["core", "storage", "config", "checkpoint", "strategy", "actors", "models", "trainers"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(stagehand/)?([a-z_]+)/')
MAX_LINES = 600
URL_SCHEME = re.compile(r'"(s3|gs)://')
KNOWS_URLS = {"storage", "config"}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    checked = 0
    for rank, layer in enumerate(LAYERS):
        allowed = set(LAYERS[: rank + 1])
        folder = os.path.join(root, layer)
        names = sorted(os.path.relpath(os.path.join(d, n), folder)
                       for d, _, files in os.walk(folder) for n in files)
        for name in names:
            if not name.endswith((".hpp", ".cpp", ".cu", ".cuh")):
                continue
            checked += 1
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                lines = f.readlines()
            if len(lines) > MAX_LINES:
                bad.append(f"{layer}/{name}: {len(lines)} lines, more than {MAX_LINES}: split it by responsibility")
            for number, line in enumerate(lines, 1):
                if layer not in KNOWS_URLS and URL_SCHEME.search(line) and not line.lstrip().startswith("//"):
                    bad.append(f"{layer}/{name}:{number}: names an object-store URL scheme; ask the FileSystem instead")
                m = INCLUDE.match(line)
                if not m:
                    continue
                if m.group(2) not in allowed:
                    bad.append(f"{layer}/{name}:{number}: includes {m.group(2)}/, not {layer}/ or a layer below it")
                elif not m.group(1):
                    bad.append(f"{layer}/{name}:{number}: includes \"{m.group(2)}/...\" without the stagehand/ prefix")
    for line in bad:
        print(line)
    print(f"{checked} files in {len(LAYERS)} layers checked, {len(bad)} problem(s)")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
