"""Training-step times of the models fusekit.torch patches, unpatched and patched, eager and under
torch.compile, in one process: Hugging Face BertForMaskedLM (BERT-base, batch 64 x 128 with
padding: scripts/peers/ops/bert_step.py's model, data and optimizer) and timm's Swin-T (batch 128,
224 x 224, cross-entropy with label smoothing 0.1), AMP in fp16 or bf16, fused AdamW. Each variant
starts from the same weights; medians of --steps steps after --warmup, timed with CUDA events, and
the peak memory PyTorch's allocator reserved (and allocated). Prints a table and writes --json.

    PYTHONPATH=python python3 scripts/torch-patch-bench.py --models bert,swin --dtype fp16 --json out.json
"""
import argparse
import gc
import json
import os
import signal
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import fusekit.torch  # noqa: E402

VARIANTS = ("eager", "compile", "fusekit", "fusekit-compile")


class VariantTimeout(BaseException):
    """Raised by the alarm; a BaseException, so that no `except Exception` on the way (Dynamo's,
    Inductor's) swallows it or wraps it in its own error."""


def _on_alarm(signum, frame):
    raise VariantTimeout()


signal.signal(signal.SIGALRM, _on_alarm)


class StackWatch:
    """Every `every` seconds while armed, writes the main thread's Python stack to `file`: its
    depth, the outermost 40 frames (who started the slow work) and the innermost 8 (what it is
    doing). From a Python thread, through sys._current_frames (faulthandler's timed dump keeps only
    the innermost 100 frames, and crashed a probe once)."""

    def __init__(self, file, every):
        self.file, self.every, self.armed = file, every, threading.Event()
        self.main = threading.main_thread().ident
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            time.sleep(self.every)
            if not self.armed.is_set():
                continue
            frame = sys._current_frames().get(self.main)
            frames = []
            while frame is not None:
                frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            frames.reverse()  # outermost first
            shown = frames if len(frames) <= 48 else frames[:40] + ["..."] + frames[-8:]
            print(f"-- {time.strftime('%H:%M:%S')}: {len(frames)} frames", file=self.file)
            print("\n".join("  " + f for f in shown), file=self.file, flush=True)


# Overrides of BERT-base for probing torch.compile (--bert-layers, --bert-dropout): None keeps it.
BERT_LAYERS = None
BERT_DROPOUT = None
# The module kinds the fusekit variants patch (--patch-only, --patch-exclude): None and () patch every kind.
PATCH_ONLY = None
PATCH_EXCLUDE = ()


def bert_setup(dtype):
    from ops import bert_step
    model = bert_step.make_model("bert-base")
    if BERT_LAYERS is not None:
        model.bert.encoder.layer = model.bert.encoder.layer[:BERT_LAYERS]
    if BERT_DROPOUT is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = BERT_DROPOUT
            if hasattr(module, "dropout_prob"):
                module.dropout_prob = BERT_DROPOUT
    batches = bert_step.device_batches(64, 128)

    def loss_of(fn, i):
        ids, types, mask, labels = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=dtype):
            return fn(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss

    return model, bert_step.make_optimizer(model), loss_of


def swin_setup(dtype):
    import timm
    torch.manual_seed(1)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, drop_path_rate=0.0).cuda().train()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(128, 3, 224, 224, generator=g).cuda(), torch.randint(0, 1000, (128,), generator=g).cuda())
               for _ in range(2)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def loss_of(fn, i):
        images, labels = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=dtype):
            return F.cross_entropy(fn(images).float(), labels, label_smoothing=0.1)

    return model, optimizer, loss_of


def run(setup, variant, dtype, warmup, steps, profile=None):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch._dynamo.reset()
    model, optimizer, loss_of = setup(dtype)
    report = fusekit.torch.patch(model, warn=False, only=PATCH_ONLY, exclude=PATCH_EXCLUDE) \
        if variant.startswith("fusekit") else None
    fn = torch.compile(model) if variant.endswith("compile") else model
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=dtype == torch.float16)
    counters = torch._dynamo.utils.counters
    counters.clear()
    times, host = [], []

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(fn, i)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    for i in range(warmup + steps):
        if i <= 1:
            torch.cuda.synchronize()
            wall = time.perf_counter()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        enqueue = time.perf_counter()
        loss = step(i)
        host.append(time.perf_counter() - enqueue)
        end.record()
        if i <= 1:  # the first two steps' seconds: compilation, and whether the second compiles again
            torch.cuda.synchronize()
            print(f"  {variant}: step {i} took {time.perf_counter() - wall:.1f} s", file=sys.stderr, flush=True)
        if i >= warmup:
            times.append((begin, end))
    torch.cuda.synchronize()
    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    if variant.endswith("compile"):
        print(f"  {variant}: Dynamo compiled {graphs} graphs, {breaks} graph breaks", file=sys.stderr, flush=True)
    ms = [b.elapsed_time(e) for b, e in times]
    result = {"median_ms": statistics.median(ms), "q1_ms": statistics.quantiles(ms, n=4)[0],
              "q3_ms": statistics.quantiles(ms, n=4)[2], "peak_bytes": torch.cuda.max_memory_reserved(),
              # What tensors held at the peak; reserved minus this is the allocator's caching and
              # fragmentation, which differ between variants of the same saved activations.
              "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
              # Host time to enqueue a step: near median_ms, the step waits on the host (launch-bound),
              # well below it, on the GPU; a synchronization inside the step (e.g. a model's own
              # check of its mask) counts its wait here too.
              "host_ms": 1e3 * statistics.median(host[warmup:]),
              "last_loss": float(loss.detach()), "fused": len(report.fused()) if report else 0,
              "dynamo_graphs": graphs, "graph_breaks": breaks}
    if report is not None and not report.fused():
        print(f"  {variant}: warning: the patch fused no module of this model (--patch-only/--patch-exclude?)",
              file=sys.stderr, flush=True)
    if profile:  # three more steps under PyTorch's profiler (after the numbers above are taken)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                step(warmup + steps + i)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        profile.write(f"==== {variant}: the three steps' operators by self CPU time\n{table}\n")
        profile.flush()
    del model, optimizer, fn
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert,swin")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--variant-timeout", type=int, default=0,
                        help="stop a variant after this many seconds and go on (0: no limit)")
    parser.add_argument("--bert-layers", type=int, help="keep the first N encoder layers (a probe)")
    parser.add_argument("--bert-dropout", type=float, help="every dropout probability of BERT (a probe)")
    parser.add_argument("--stacks", help="write the main thread's Python stack to this file every --stack-every "
                        "seconds while a variant runs (where a slow compilation spends its time)")
    parser.add_argument("--stack-every", type=int, default=30)
    parser.add_argument("--patch-only", help="fusekit variants: patch these module kinds alone (comma-separated "
                        "class names, e.g. SwinTransformerBlock; fusekit.torch.patch's only=)")
    parser.add_argument("--patch-exclude", help="fusekit variants: patch all kinds but these (exclude=)")
    parser.add_argument("--profile", help="after each variant's timed steps, profile three more with "
                        "torch.profiler and append its operators by self CPU time to this file")
    args = parser.parse_args()
    if args.stack_every <= 0:
        parser.error("--stack-every must be a positive number of seconds")
    stacks = StackWatch(open(args.stacks, "w"), args.stack_every) if args.stacks else None
    profile = open(args.profile, "w") if args.profile else None
    global BERT_LAYERS, BERT_DROPOUT, PATCH_ONLY, PATCH_EXCLUDE
    BERT_LAYERS, BERT_DROPOUT = args.bert_layers, args.bert_dropout
    PATCH_ONLY = args.patch_only.split(",") if args.patch_only else None
    PATCH_EXCLUDE = args.patch_exclude.split(",") if args.patch_exclude else ()
    try:
        fusekit.matching.selection(PATCH_ONLY, PATCH_EXCLUDE)
    except ValueError as e:
        parser.error(str(e))
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    setups = {"bert": bert_setup, "swin": swin_setup}
    results = {}
    for name in args.models.split(","):
        for variant in args.variants.split(","):
            signal.alarm(args.variant_timeout)  # a variant that compiles for ever does not take the others down
            if stacks:
                print(f"==== {name}/{variant}", file=stacks.file, flush=True)
                stacks.armed.set()
            try:
                r = run(setups[name], variant, dtype, args.warmup, args.steps, profile)
            except (VariantTimeout, Exception) as e:
                # Inductor has wrapped the timeout in its own error when it raised it as an Exception:
                # recognised by its chain or, where the chain was cut (`from None`), by its message.
                chain, timed_out = e, False
                while chain is not None and not timed_out:
                    timed_out = isinstance(chain, VariantTimeout) or "VariantTimeout" in type(chain).__name__
                    chain = chain.__cause__ or chain.__context__
                if not timed_out and "VariantTimeout" not in f"{type(e).__name__}: {e}":
                    raise
                print(f"{name:5s} {variant:16s} stopped after {args.variant_timeout} s (compiling or recompiling?)",
                      flush=True)
                results[f"{name}/{variant}"] = {"timed_out_s": args.variant_timeout}
                torch._dynamo.reset()
                continue
            finally:
                signal.alarm(0)
                if stacks:
                    stacks.armed.clear()
            results[f"{name}/{variant}"] = r
            eager = results.get(f"{name}/eager", {})
            eager = eager if "median_ms" in eager else None
            print(f"{name:5s} {variant:16s} {r['median_ms']:8.2f} ms (q1 {r['q1_ms']:.2f}, q3 {r['q3_ms']:.2f})  "
                  f"host {r['host_ms']:6.2f} ms  peak {r['peak_bytes'] / 2**30:6.2f} GiB "
                  f"({r['peak_allocated_bytes'] / 2**30:.2f} allocated)"
                  + (f"  {eager['median_ms'] / r['median_ms']:5.2f}x eager" if eager else ""), flush=True)
            if args.json:  # after every variant, so that a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"dtype": args.dtype, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "autograd": fusekit.ops.AUTOGRAD, "patch_only": PATCH_ONLY,
                               "patch_exclude": list(PATCH_EXCLUDE), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
