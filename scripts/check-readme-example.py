#!/usr/bin/env python3
"""Checks that the README shows the Checkpointer examples exactly as the test suite runs them.

For each example below, the lines between its two markers (the example is built and run by
ctest) must appear, in order and unchanged, in a ```cpp or ```python block of README.md, and stay under 15
lines of code.

  scripts/check-readme-example.py [SOURCE_DIR]
"""
import os
import re
import sys

EXAMPLES = [("checkpointer_example.cpp", "// [facade]"), ("spmd_example.cpp", "// [spmd]"),
            ("python_example.py", "# [python]")]
LIMIT = 15


def check(root, shown, name, marker):
    with open(os.path.join(root, "examples", name), encoding="utf-8") as f:
        lines = f.read().split("\n")
    marks = [i for i, line in enumerate(lines) if line.strip() == marker]
    if len(marks) != 2:
        print(f"{name}: expected two '{marker}' lines, found {len(marks)}")
        return False
    example = [line.strip() for line in lines[marks[0] + 1 : marks[1]] if line.strip()]
    if not any(example == s[i : i + len(example)] for s in shown for i in range(len(s))):
        print(f"README.md has no code block with the lines of {name}:\n  " + "\n  ".join(example))
        return False
    if len(example) >= LIMIT:
        print(f"{name}: the example has {len(example)} lines; keep it under {LIMIT}")
        return False
    print(f"README shows the {len(example)}-line example of {name} that the suite runs")
    return True


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```(?:cpp|python)\n(.*?)```", f.read(), re.S)
    shown = [[line.strip() for line in b.split("\n") if line.strip()] for b in blocks]
    ok = [check(root, shown, name, marker) for name, marker in EXAMPLES]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
