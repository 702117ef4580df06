"""PyTorch peers of fusekit's operator suite: PyTorch eager and torch.compile on the same cases.

Each case is timed like fusekit's runner: warm-up, then timed samples, each a batch of back-to-back
repetitions between two CUDA events spanning at least --sample-us of device time, rotating through
input sets larger than twice the L2, every sample kept, with no tracer in the process.
`fusekit bench --suite ops --peers scripts/peers/ops.py` runs it twice into the same run of the
store (FUSEKIT_TRACE_DB, FUSEKIT_TRACE_RUN): once untraced, writing its cases and samples as
variants peer:eager and peer:compile, and once under `fusekit trace` with --traced-only, which
runs a few repetitions per case inside NVTX ranges "<case> [<variant>]" and writes no samples, so
the peers' kernels sit in the same store as fusekit's.

The operators are the modules of scripts/peers/ops/ (one per operator, as in suites/ops/).
"""
import argparse
import importlib
import math
import os
import sqlite3
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Suite order (suites/ops/ops_suite.cpp).
OPERATORS = ["layernorm", "bias_gelu", "softmax", "bias_dropout_residual_layernorm", "cross_entropy", "adamw",
             "linear", "embedding_layernorm", "window_partition", "window_merge", "patch_merging",
             "window_attention", "qkv_projection", "bert_attention"]
SCHEMA_VERSION = "1"


MAX_SAMPLE_BATCH = 1000  # suites/runner.h kMaxSampleBatch


def time_case(step, sets: int, warmup: int, warmup_ms: float, reps: int, sample_us: float, label: str) -> list:
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
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    r = 0
    for start, end in events:
        start.record()
        for _ in range(sample_batch):
            step(r % sets)
            r += 1
        end.record()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return [start.elapsed_time(end) * 1e6 / sample_batch for start, end in events]  # ns a repetition


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--variants", default="eager,compile")
    parser.add_argument("--ops", default=",".join(OPERATORS), help="operators to run (default: all)")
    parser.add_argument("--shapes", help="shapes instead of the suite's (with one operator in --ops)")
    parser.add_argument("--directions", default="fwd,fwd+bwd", help="fwd and/or fwd+bwd")
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
    db_path, run = os.environ.get("FUSEKIT_TRACE_DB"), os.environ.get("FUSEKIT_TRACE_RUN")
    if not db_path or not run:
        print("ops.py: run it under `fusekit trace --db DB -- python3 scripts/peers/ops.py`", file=sys.stderr)
        return 2
    unknown = [op for op in args.ops.split(",") if op not in OPERATORS]
    if unknown:
        print(f"ops.py: unknown operator {unknown[0]} (available: {', '.join(OPERATORS)})", file=sys.stderr)
        return 2
    db = sqlite3.connect(db_path, timeout=30)
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("application") != "fusekit":
        print(f"ops.py: {db_path}: not a fusekit store", file=sys.stderr)
        return 1
    if meta.get("schema_version") != SCHEMA_VERSION:
        print(f"ops.py: {db_path}: store schema {meta.get('schema_version')}, this script writes {SCHEMA_VERSION}",
              file=sys.stderr)
        return 1

    # One compiled function per operator sees every shape, dtype and direction of the suite: raise
    # Dynamo's recompile limits, which would otherwise fall back to eager silently after 8 variants.
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 4096)

    cases = []
    for op in args.ops.split(","):
        module = importlib.import_module(f"ops.{op}")
        directions = [d == "fwd+bwd" for d in args.directions.split(",")]
        shapes = args.shapes.split(",") if args.shapes else None
        cases.extend(module.cases(args.dtypes.split(","), directions, shapes))
    compiled = {}
    for i, case in enumerate(cases):
        for variant in args.variants.split(","):
            if variant == "eager":
                fn = case.function
            else:
                if case.function not in compiled:
                    compiled[case.function] = torch.compile(case.function, dynamic=False)
                fn = compiled[case.function]
            step = case.make_step(fn)
            label = f"{case.name} [peer:{variant}]"
            print(f"[{i + 1}/{len(cases)}] {label}", file=sys.stderr, flush=True)
            with torch.enable_grad() if case.backward else torch.no_grad():
                samples = time_case(step, case.sets, args.warmup, args.warmup_ms, args.reps, args.sample_us,
                                    label)
            if args.traced_only:
                continue
            with db:
                cursor = db.execute(
                    "INSERT INTO cases(runId, name, op, shape, dtype, variant, bytes, flops) VALUES (?,?,?,?,?,?,?,?)",
                    (int(run), case.name, case.op, case.shape, case.dtype, f"peer:{variant}", case.bytes,
                     case.flops))
                db.executemany("INSERT INTO samples(caseId, rep, nanoseconds) VALUES (?,?,?)",
                               [(cursor.lastrowid, r, t) for r, t in enumerate(samples)])
        if case.release:
            case.release()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
