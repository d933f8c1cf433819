#!/usr/bin/env python3
"""Writes the usage example of include/spectree.h (the lines between the two ' * ----' lines of
its top comment, with the comment prefix removed) to a C file that test_example.c includes, so
that the manual's example is compiled and run exactly as printed."""
import sys

header, out = sys.argv[1], sys.argv[2]
lines = open(header, encoding="utf-8").read().split("\n")
marks = [i for i, l in enumerate(lines) if l.rstrip() == " * ----"]
if len(marks) < 2:
    sys.exit(f"{header}: no example between two ' * ----' lines")
body = []
for l in lines[marks[0] + 1 : marks[1]]:
    if not l.startswith(" *"):
        sys.exit(f"{header}: example line outside the comment: {l!r}")
    body.append(l[7:] if l.startswith(" *     ") else l[2:].strip())
with open(out, "w", encoding="utf-8") as f:
    f.write("/* Generated from include/spectree.h by tests/example/extract.py. */\n")
    f.write("\n".join(body) + "\n")
