#!/usr/bin/env python3
"""Checks how the GPU test programs are registered with ctest, without running a GPU case.

Every GPU test program is one ctest test labelled `gpu`; a program with long cases also has a
second test, <name>_long, labelled `long`, that runs only those (a GoogleTest filter), while the
first runs the rest. This checks, from the manifest tests/gpu/CMakeLists.txt writes (name, program,
long-case filter, a line each):
- `ctest -N -L gpu` lists exactly one test per program and `ctest -N -L long` exactly the _long
  tests (ctest -L takes a regular expression: a label containing "gpu" would be selected by both);
- for each program with long cases, every pattern of its filter names at least one case (a renamed
  case must not move silently), and its two tests together run every case exactly once.

Usage: gpu_test_labels_check.py CTEST BUILD_DIR MANIFEST
"""
import re
import subprocess
import sys


def ctest_names(ctest, build_dir, label):
    out = subprocess.run([ctest, "-N", "-L", label], cwd=build_dir, capture_output=True, text=True, check=True).stdout
    return sorted(re.findall(r"Test\s+#\d+: (\S+)", out))


def case_count(program, gtest_filter=None):
    command = [program, "--gtest_list_tests"]
    if gtest_filter is not None:
        command.append("--gtest_filter=" + gtest_filter)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("  "))


def main():
    if len(sys.argv) != 4:
        print("usage: gpu_test_labels_check.py CTEST BUILD_DIR MANIFEST", file=sys.stderr)
        return 2
    ctest, build_dir, manifest = sys.argv[1:]
    programs = []
    with open(manifest, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                name, program, long_cases = (line.rstrip("\n").split("\t") + [""])[:3]
                programs.append((name, program, long_cases))
    failures = []

    expected_gpu = sorted(name for name, _, _ in programs)
    expected_long = sorted(name + "_long" for name, _, long_cases in programs if long_cases)
    for label, expected in (("gpu", expected_gpu), ("long", expected_long)):
        listed = ctest_names(ctest, build_dir, label)
        if listed != expected:
            failures.append(f"ctest -L {label} lists {listed}, expected {expected}")

    for name, program, long_cases in programs:
        total = case_count(program)
        if total == 0:
            failures.append(f"{name}: no cases")
        if not long_cases:
            print(f"{name}: {total} cases, label gpu")
            continue
        for pattern in long_cases.split(":"):
            if case_count(program, pattern) == 0:
                failures.append(f"{name}: the long-case pattern {pattern} names no case")
        long = case_count(program, long_cases)
        quick = case_count(program, "-" + long_cases)
        if quick + long != total:
            failures.append(f"{name}: {quick} quick + {long} long cases, but the program has {total}")
        print(f"{name}: {total} cases, {quick} label gpu, {long} label long")

    for failure in failures:
        print("FAILED: " + failure)
    print(f"{len(programs)} GPU test programs, {len(expected_long)} with long cases, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
