#!/usr/bin/env python3
"""Checks the README and docs/: every relative link points at a file of the repository (and an
anchor, when given, at one of its headings), every page of docs/ is linked from the README, and
nothing sends a reader outside the repository (to ../shared).

  scripts/check-docs.py [SOURCE_DIR]
"""
import os
import re
import sys


def anchors(path):
    with open(path, encoding="utf-8") as f:
        heads = re.findall(r"(?m)^#+ (.*)$", f.read())
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    pages = ["README.md"] + sorted("docs/" + p for p in os.listdir(os.path.join(root, "docs")) if p.endswith(".md"))
    problems = []
    linked = set()
    for page in pages:
        path = os.path.join(root, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if "../shared" in text:
            problems.append(f"{page}: refers to ../shared, which readers of the repository do not have")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                problems.append(f"{page}: link to '{target}': no such file")
                continue
            linked.add(os.path.relpath(dest, root))
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{page}: link to '{target}': no heading '{anchor}' there")
    for page in pages[1:]:
        if page not in linked:
            problems.append(f"{page} is not linked from any page")
    for p in problems:
        print(p)
    print(f"{len(pages)} pages checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
