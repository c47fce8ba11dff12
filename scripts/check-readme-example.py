#!/usr/bin/env python3
"""Checks that the README shows the Checkpointer example exactly as the test suite runs it.

The lines between the two `// [facade]` markers of examples/checkpointer_example.cpp (which
ctest builds and runs) must appear, in order and unchanged, in a ```cpp block of README.md, and
stay under 15 lines of code.

  scripts/check-readme-example.py [SOURCE_DIR]
"""
import os
import re
import sys

MARKER = "// [facade]"
LIMIT = 15


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "examples", "checkpointer_example.cpp"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    marks = [i for i, line in enumerate(lines) if line.strip() == MARKER]
    if len(marks) != 2:
        print(f"checkpointer_example.cpp: expected two '{MARKER}' lines, found {len(marks)}")
        return 1
    example = [line.strip() for line in lines[marks[0] + 1 : marks[1]] if line.strip()]
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```cpp\n(.*?)```", f.read(), re.S)
    shown = [[line.strip() for line in b.split("\n") if line.strip()] for b in blocks]
    if not any(example == s[i : i + len(example)] for s in shown for i in range(len(s))):
        print("README.md has no ```cpp block with the example's lines:\n  " + "\n  ".join(example))
        return 1
    if len(example) >= LIMIT:
        print(f"the example has {len(example)} lines; keep it under {LIMIT}")
        return 1
    print(f"README shows the {len(example)}-line example the suite runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
