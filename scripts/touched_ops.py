#!/usr/bin/env python3
"""Which of fusekit's benchmarked operators a change touches: the operators a GPU CI job re-measures
and gates (scripts/ci-gate.sh). Reads changed paths (one per line, relative to the repository, as
`git diff --name-only BASE...HEAD` prints them) on standard input and prints one line: the touched
operators, comma-separated, "all", or nothing.

    git diff --name-only origin/main...HEAD | python3 scripts/touched_ops.py --known layernorm,softmax,...

--known lists the operators the suites have (`fusekit cases` gives them). A change reaches an
operator through:
- a kernel source or any header it includes, directly or through other headers (the include graph
  of kernels/ is read from the tree: `#include "kernels/..."`); a kernel source names its operators
  (kernels/swin_window.cu: window_partition and window_merge; kernels/linear.cu: linear and
  qkv_projection; others by file name); a changed source or header that no single operator owns
  (kernels/common.cuh, dtype.cpp) reaches all of them;
- the operator's baseline (baselines/<op>), its cases (suites/ops/<op>.cpp) or its peer
  (scripts/peers/ops/<op>.py); what all cases share (the runner, the session, the suite's
  operands, the peers' driver) reaches all of them;
- models/ and baselines/models/: the whole training steps (bert_step), which every kernel change
  reaches too.
Anything else (documentation, reports, the CLI, tests) reaches none: it cannot move a timing.
"""
import argparse
import os
import re
import sys

# Kernel sources whose operators are not named by the file.
SOURCE_OPS = {
    "swin_window": ["window_partition", "window_merge"],
    "swin_window_patch_merging": ["patch_merging"],
    "linear": ["linear", "qkv_projection"],
    "skinny_linear": ["linear", "qkv_projection"],
}
SHARED = re.compile(r"^(suites/(runner|session|recorded_command)\.|suites/ops/(operands|ops_suite)\.|"
                    r"scripts/peers/(ops\.py|ops/(common|cases|__init__)\.py)|CMakeLists\.txt$|cmake/|"
                    r"kernels/CMakeLists\.txt$)")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(kernels/[^"]+)"', re.M)


def include_graph(root):
    """{file: set of kernels/ files it includes}, for every source and header under kernels/."""
    graph = {}
    for folder, _, files in os.walk(os.path.join(root, "kernels")):
        for name in files:
            if not name.endswith((".cu", ".cuh", ".h", ".cpp")):
                continue
            path = os.path.relpath(os.path.join(folder, name), root)
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                graph[path] = set(INCLUDE.findall(f.read()))
    return graph


def kernel_sources_reaching(path, graph):
    """The top-level kernel sources (kernels/*.cu, kernels/*.cpp) that are `path` or include it."""
    reached, frontier = {path}, [path]
    while frontier:
        current = frontier.pop()
        for source, includes in graph.items():
            if current in includes and source not in reached:
                reached.add(source)
                frontier.append(source)
    return sorted(p for p in reached if re.fullmatch(r"kernels/[^/]+\.(cu|cpp)", p))


def ops_of_stem(stem, known):
    """The operators of a kernel source or baseline named `stem`, or None where it names none."""
    ops = [op for op in SOURCE_OPS.get(stem, [stem]) if op in known]
    return ops or None


def touched(paths, known, graph):
    ops = set()
    for path in paths:
        path = path.strip()
        if not path:
            continue
        if SHARED.search(path):
            return "all"
        if path.startswith(("models/", "baselines/models/")):
            if "bert_step" in known:
                ops.add("bert_step")
            continue
        if path.startswith("kernels/reference/"):
            continue  # the float64 references are read by tests only
        if path.startswith("kernels/"):
            sources = kernel_sources_reaching(path, graph) if path in graph else []
            if not sources:
                if path.endswith((".cu", ".cuh", ".h", ".cpp")):
                    return "all"  # a kernel file the tree no longer has, or one nothing includes
                continue
            for source in sources:
                stem = os.path.splitext(os.path.basename(source))[0]
                named = ops_of_stem(stem, known)
                if named is None:
                    return "all"  # e.g. dtype.cpp: every operator
                ops.update(named)
            if "bert_step" in known:
                ops.add("bert_step")  # the fused training step runs on the kernels
            continue
        match = re.fullmatch(r"(baselines|suites/ops|scripts/peers/ops)/([a-z0-9_]+)\.(cpp|h|cu|py)", path)
        if match:
            named = ops_of_stem(match.group(2), known)
            if named is None:
                return "all"
            ops.update(named)
    return ",".join(sorted(ops))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--known", required=True, help="the suites' operators, comma-separated")
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parser.parse_args(argv)
    known = {op for op in args.known.split(",") if op}
    print(touched(sys.stdin.read().splitlines(), known, include_graph(args.root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
