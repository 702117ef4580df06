"""PyTorch peers of fusekit's operator suite: PyTorch eager and torch.compile on the same cases.

Each case is timed like fusekit's runner: warm-up, then timed repetitions between CUDA events,
rotating through input sets larger than twice the L2, every sample kept, with no tracer in the
process. `fusekit bench --suite ops --peers scripts/peers/ops.py` runs it twice into the same run
of the store (FUSEKIT_TRACE_DB, FUSEKIT_TRACE_RUN): once untraced, writing its cases and samples as
variants peer:eager and peer:compile, and once under `fusekit trace` with --traced-only, which
runs a few repetitions per case inside NVTX ranges "<case> [<variant>]" and writes no samples, so
the peers' kernels sit in the same store as fusekit's.
"""
import argparse
import os
import sqlite3
import sys

import torch
import torch.nn.functional as F

# The operator suite's LayerNorm shapes (suites/ops/ops_suite.cpp).
LAYERNORM_SHAPES = ["8192x768", "8192x1024", "16384x1024", "401408x96", "401408x128", "401408x192",
                    "100352x384", "6272x768"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-5


def layernorm_bytes(rows: int, columns: int, size: int, backward: bool) -> float:
    forward = 2 * rows * columns * size + 2 * columns * size + 2 * rows * 4
    back = 3 * rows * columns * size + 3 * columns * size + 2 * rows * 4
    return forward + back if backward else forward


def rotation_sets(bytes_per_set: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, 2 * l2 // max(bytes_per_set, 1) + 1)


def time_case(step, sets: int, warmup: int, reps: int, label: str) -> list:
    for r in range(warmup):
        step(r % sets)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(label)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for r, (start, end) in enumerate(events):
        start.record()
        step(r % sets)
        end.record()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return [start.elapsed_time(end) * 1e6 for start, end in events]  # ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--variants", default="eager,compile")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--traced-only", action="store_true", help="a few repetitions for the tracer; no samples")
    args = parser.parse_args()
    if args.traced_only:
        args.reps, args.warmup = 3, 2
    db_path, run = os.environ.get("FUSEKIT_TRACE_DB"), os.environ.get("FUSEKIT_TRACE_RUN")
    if not db_path or not run:
        print("ops.py: run it under `fusekit trace --db DB -- python3 scripts/peers/ops.py`", file=sys.stderr)
        return 2
    db = sqlite3.connect(db_path, timeout=30)
    if db.execute("SELECT value FROM meta WHERE key = 'application'").fetchone() != ("fusekit",):
        print(f"ops.py: {db_path}: not a fusekit store", file=sys.stderr)
        return 1

    def layernorm(x, gamma, beta, dy):
        if dy is None:
            return F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
        x = x.detach().requires_grad_(True)
        gamma = gamma.detach().requires_grad_(True)
        beta = beta.detach().requires_grad_(True)
        y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
        y.backward(dy)
        return y

    compiled = torch.compile(layernorm, dynamic=False)
    cases = [(d, b, s) for d in args.dtypes.split(",") for b in (False, True) for s in LAYERNORM_SHAPES]
    for i, (dtype_name, backward, shape) in enumerate(cases):
        rows, columns = (int(v) for v in shape.split("x"))
        dtype = DTYPES[dtype_name]
        size = torch.finfo(dtype).bits // 8
        n_bytes = rows * columns * size * (4 if backward else 2)
        sets = rotation_sets(n_bytes)
        xs = [(torch.rand(rows, columns, device="cuda") * 4 - 1.5).to(dtype) for _ in range(sets)]
        dys = [(torch.rand(rows, columns, device="cuda") * 2 - 1).to(dtype) for _ in range(sets)] if backward else None
        gamma = (1 + 0.2 * (torch.rand(columns, device="cuda") * 2 - 1)).to(dtype)
        beta = (0.1 * (torch.rand(columns, device="cuda") * 2 - 1)).to(dtype)
        name = f"layernorm/{shape}/{dtype_name}/{'fwd+bwd' if backward else 'fwd'}"
        for variant in args.variants.split(","):
            fn = layernorm if variant == "eager" else compiled
            if backward:
                step = lambda s, fn=fn: fn(xs[s], gamma, beta, dys[s])
            else:
                step = lambda s, fn=fn: fn(xs[s], gamma, beta, None)
            label = f"{name} [peer:{variant}]"
            print(f"[{i + 1}/{len(cases)}] {label}", file=sys.stderr, flush=True)
            with torch.no_grad() if not backward else torch.enable_grad():
                samples = time_case(step, sets, args.warmup, args.reps, label)
            if args.traced_only:
                continue
            with db:
                cursor = db.execute(
                    "INSERT INTO cases(runId, name, op, shape, dtype, variant, bytes, flops) VALUES (?,?,?,?,?,?,?,0)",
                    (int(run), name, "layernorm", shape, dtype_name, f"peer:{variant}",
                     layernorm_bytes(rows, columns, size, backward)))
                db.executemany("INSERT INTO samples(caseId, rep, nanoseconds) VALUES (?,?,?)",
                               [(cursor.lastrowid, r, t) for r, t in enumerate(samples)])
        del xs, dys
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
