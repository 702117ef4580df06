"""A small PyTorch training loop (MLP, AdamW) for tracing tests.

Under `fusekit trace` it runs as is; with --torch-profiler it profiles the same loop with PyTorch's
own profiler and prints the total GPU kernel time, so the two instruments can be compared.
The loop sits in an NVTX range "train_loop", each step in "train_step".
"""
import argparse
import json
import sys

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--torch-profiler", metavar="TRACE_JSON", help="profile with torch.profiler, write its trace")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.randn(4096, 1024, device="cuda")

    def steps(count: int, name: str) -> None:
        for _ in range(count):
            torch.cuda.nvtx.range_push(name)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.nvtx.range_pop()

    steps(5, "warmup_step")
    torch.cuda.synchronize()

    def loop() -> None:
        torch.cuda.nvtx.range_push("train_loop")
        steps(args.steps, "train_step")
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()

    if args.torch_profiler:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            loop()
        prof.export_chrome_trace(args.torch_profiler)
        with open(args.torch_profiler) as f:
            events = json.load(f)["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
        total_us = sum(float(e["dur"]) for e in kernels)
        print(f"torch_profiler_kernels {len(kernels)}")
        print(f"torch_profiler_kernel_ns {total_us * 1000:.0f}")
    else:
        loop()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
