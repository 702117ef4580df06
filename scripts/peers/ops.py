"""PyTorch peers of fusekit's operator suites: PyTorch eager and torch.compile on the same cases.

The cases are fusekit's: --cases FILE (- for standard input) is the JSON listing that `fusekit
cases` prints (suites/peers.h), with each case's name, operator, shape, dtype and direction. Each
case is timed like fusekit's runner: warm-up, then timed samples, each a batch of back-to-back
repetitions between two CUDA events spanning at least --sample-us of device time, rotating through
input sets larger than twice the L2, every sample kept, with no tracer in the process. The samples
go to --results FILE, one JSON line per case and variant (peer:eager, peer:compile); fusekit checks
them and writes them into its store. This script writes no store.

`fusekit bench --suite ops --peers scripts/peers/ops.py` runs it twice into the same run: once
untraced, with --results, and once under the tracer with --traced-only, which runs a few
repetitions per case inside NVTX ranges "<case> [<variant>]" and writes no samples, so the peers'
kernels sit in the same store as fusekit's. By hand:
  fusekit cases --op layernorm --shape 8192x768 --dtype fp16 | python3 scripts/peers/ops.py --cases - --results r.jsonl

The operators are the modules of scripts/peers/ops/ (one per operator, as in suites/ops/); a case
whose operator has no module is skipped with a note.
"""
import argparse
import gc
import importlib
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ops.cases import gpu_conditions, read_cases, result_line  # noqa: E402 (after the path is set)


MAX_SAMPLE_BATCH = 1000  # suites/runner.h kMaxSampleBatch


BEGAN = time.monotonic()  # the progress lines say when each case began, in seconds since the start


def time_case(step, sets: int, warmup: int, warmup_ms: float, reps: int, sample_us: float, label: str,
              rep_ranges: bool = False) -> list:
    """Samples in ns a repetition, timed inside the NVTX range `label`; with rep_ranges (the traced
    run) each repetition inside a range "rep" too, as fusekit's runner marks its traced repetitions."""
    for r in range(warmup):
        step(r % sets)
    torch.cuda.synchronize()
    # Then more until warmup_ms of device time has passed (fusekit's runner does the same): every
    # variant is timed in the steady state, whatever ran before it.
    elapsed, batch, r, per_rep = 0.0, 1, warmup, 0.0
    while True:  # at least one batch, for the time per repetition
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            step(r % sets)
            r += 1
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        elapsed += ms
        per_rep = max(ms / batch, 1e-3)
        batch = max(1, min(100000, math.ceil((warmup_ms - elapsed) / per_rep)))
        if elapsed >= warmup_ms:
            break
    sample_batch = 1 if sample_us <= 0 else max(1, min(MAX_SAMPLE_BATCH, math.ceil(sample_us * 1e-3 / per_rep)))
    torch.cuda.nvtx.range_push(label)
    try:  # the ranges stay balanced if a step raises: the next case's ranges must not nest in this one's
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        r = 0
        for start, end in events:
            start.record()
            for _ in range(sample_batch):
                if rep_ranges:
                    torch.cuda.nvtx.range_push("rep")
                try:
                    step(r % sets)
                finally:
                    if rep_ranges:
                        torch.cuda.nvtx.range_pop()
                r += 1
            end.record()
        torch.cuda.synchronize()
    finally:
        torch.cuda.nvtx.range_pop()
    return [start.elapsed_time(end) * 1e6 / sample_batch for start, end in events]  # ns a repetition


def peer_module(op: str):
    """The operator's peer module, or None where the peers have none."""
    try:
        return importlib.import_module(f"ops.{op}")
    except ModuleNotFoundError as e:
        if e.name == f"ops.{op}":
            return None
        raise


def run_case(module, listed_case, i, count, args, bus_id, results):
    """Every variant of one case: timed (with --results) or run for the tracer (--traced-only). The
    case's release runs however it ends, so that a failed variant's model is not kept."""
    case = module.make_case(listed_case)
    try:
        for variant in args.variants.split(",") + list(case.extra_variants):
            if not variant.endswith("compile"):
                fn = case.function
            else:
                torch._dynamo.reset()  # only this case's graphs in the cache, so only their guards run
                fn = torch.compile(case.function, dynamic=False)
            step = case.make_step(fn, variant) if case.extra_variants else case.make_step(fn)
            label = f"{case.name} [peer:{variant}]"
            print(f"[{i + 1}/{count}] {time.monotonic() - BEGAN:.1f} s: {label}", file=sys.stderr, flush=True)
            start = gpu_conditions(bus_id, "start") if results is not None else {}
            with torch.enable_grad() if case.backward else torch.no_grad():
                samples = time_case(step, case.sets, args.warmup, args.warmup_ms, args.reps, args.sample_us,
                                    label, rep_ranges=args.traced_only)
            metrics = dict(case.metrics()) if case.metrics else {}
            if results is not None:  # the conditions around the timed samples, as the runner's
                metrics.update(start)
                metrics.update(gpu_conditions(bus_id, "end"))
                results.write(result_line(case.name, f"peer:{variant}", samples, metrics))
                results.flush()
    finally:
        if case.release:
            case.release()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="the JSON listing of the cases (fusekit cases); - for stdin")
    parser.add_argument("--results", help="file to write the samples to, one JSON line per case and variant")
    parser.add_argument("--variants", default="eager,compile")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--warmup-ms", type=float, default=25.0,
                        help="then more warm-up repetitions until this much device time has passed")
    parser.add_argument("--sample-us", type=float, default=500.0,
                        help="each timed sample: back-to-back repetitions spanning at least this much device time")
    parser.add_argument("--traced-only", action="store_true", help="a few repetitions for the tracer; no samples")
    args = parser.parse_args()
    if args.traced_only:
        args.reps, args.warmup, args.sample_us = 3, 2, 0
    elif not args.results:
        print("ops.py: --results FILE is needed (or --traced-only)", file=sys.stderr)
        return 2
    try:
        listed = read_cases(args.cases)
    except (OSError, ValueError) as e:
        print(f"ops.py: {e}", file=sys.stderr)
        return 2

    modules, skipped = {}, []
    for case in listed:
        if case.op not in modules:
            modules[case.op] = peer_module(case.op)
            if modules[case.op] is None:
                skipped.append(case.op)
    for op in skipped:
        print(f"ops.py: no peer for operator {op} (no scripts/peers/ops/{op}.py): its cases are skipped",
              file=sys.stderr)
    listed = [case for case in listed if modules[case.op] is not None]

    # Each case is compiled afresh (torch._dynamo.reset() below): Dynamo caches graphs per code object
    # and checks the guards of every cached graph on each call, so one compiled function that had
    # seen a suite's shapes spent up to ~100 us of host time a call on guards (H100: the LayerNorm
    # forward at 8192x768 timed 110 us a call while its kernels took 7.8 us). The raised limits keep
    # a case that needs a few graphs (forward + backward) from falling back to eager silently.
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 4096)

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus_id = (f"{getattr(props, 'pci_domain_id', 0):08X}:{getattr(props, 'pci_bus_id', 0):02X}:"
              f"{getattr(props, 'pci_device_id', 0):02X}.0")
    results = None if args.traced_only else open(args.results, "w", encoding="utf-8")
    failed = []
    try:
        for i, listed_case in enumerate(listed):
            # A case that raises is reported and left out; the cases after it still run (their results
            # are what a run of many cases is for), and the script exits 1 at the end.
            try:
                run_case(modules[listed_case.op], listed_case, i, len(listed), args, bus_id, results)
            except Exception:  # noqa: BLE001 (any error of one case: reported, then the next case)
                failed.append(listed_case.name)
                print(f"ops.py: {listed_case.name} failed:", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                torch._dynamo.reset()  # a compiled function may still hold the failed variant's model
                gc.collect()
            torch.cuda.empty_cache()
    finally:
        if results is not None:
            results.close()
    if failed:
        print(f"ops.py: {len(failed)} of {len(listed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
