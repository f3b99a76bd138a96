#!/usr/bin/env python3
"""Checks fastudy's folder include graph against its layer order (cmake/FastudyLayers.cmake).

Every `#include "..."` of a project file names a project folder; a file may include its own folder
and the folders of lower layers only. The order is total, so the graph it allows has no cycle.
Prints the folder graph (edges with counts) and every violation; exit 1 on a violation.
Usage: scripts/check_layers.py [SOURCE_ROOT]
"""
import os
import re
import sys

# Bottom to top. A folder's layer is that of the longest prefix listed here.
LAYERS = ["base", "kernels", "src/runtime", "src/core", "src/io", "src/train", "analysis", "jobs"]
CHECKED = tuple(LAYERS)  # tests/ and bench/ sit above everything and may include any layer
SUFFIXES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    best = None
    for name in LAYERS:
        if path == name or path.startswith(name + "/"):
            if best is None or len(name) > len(best):
                best = name
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    edges, bad = {}, []
    for top in CHECKED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                src = layer_of(path)
                if src is None:
                    continue
                with open(os.path.join(root, path), errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    dst = layer_of(inc)
                    if dst is None or dst == src:
                        continue  # generated (fastudy/version.hpp) or same folder
                    edges[(src, dst)] = edges.get((src, dst), 0) + 1
                    if LAYERS.index(dst) > LAYERS.index(src):
                        bad.append("%s includes %s: %s is above %s" % (path, inc, dst, src))
    print("layers, bottom to top: " + " < ".join(LAYERS))
    for (a, b), n in sorted(edges.items(), key=lambda e: (LAYERS.index(e[0][0]), LAYERS.index(e[0][1]))):
        print("  %-12s -> %-12s %3d include(s)" % (a, b, n))
    for line in bad:
        print("upward include: " + line)
    if bad:
        print("fix: move the shared piece down to the lowest layer that needs it (base/ for what every layer needs)")
        return 1
    print("ok: no upward include; the folder graph is acyclic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
