"""Host cost of fusekit's torch.ops against PyTorch's own ops: microseconds of host time per call
on inputs so small that the GPU is never the bottleneck, forward alone (no autograd) and forward +
backward through autograd, for the raw ops (torch.ops.fusekit.*) and the wrappers users call
(fusekit.ops.*), beside the PyTorch composition they replace. Then one BERT-base step (batch 64 x
128, fp16 AMP) unpatched and patched: host time to enqueue it and GPU time (CUDA events).

    PYTHONPATH=python FUSEKIT_TORCH_OPS_LIBRARY=build-device/torch_ops/libfusekit_torch_ops.so \\
        python3 scripts/torch-op-overhead.py
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

import fusekit.ops as fk

CALLS = 300


def host_us(fn, calls=CALLS):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def with_backward(fn, inputs):
    def run():
        out = fn(*inputs)
        out.sum().backward()
    return run


def main():
    h = torch.float16
    x = torch.randn(8, 64, device="cuda", dtype=h, requires_grad=True)
    r = torch.randn(8, 64, device="cuda", dtype=h, requires_grad=True)
    w = torch.ones(64, device="cuda", dtype=h, requires_grad=True)
    b = torch.zeros(64, device="cuda", dtype=h, requires_grad=True)
    qkv = torch.randn(2, 16, 3, 2, 64, device="cuda", dtype=h, requires_grad=True)
    lengths = torch.full((2,), 16, dtype=torch.int32, device="cuda")
    philox = torch.zeros(2, dtype=torch.int64)
    ops = torch.ops.fusekit
    rows = []
    with torch.no_grad():
        rows.append(("layernorm fwd: torch.ops.fusekit", host_us(lambda: ops.layernorm(x, w, b, 1e-5))))
        rows.append(("layernorm fwd: F.layer_norm", host_us(lambda: F.layer_norm(x, (64,), w, b, 1e-5))))
        rows.append(("bdrl fwd: torch.ops.fusekit", host_us(
            lambda: ops.bias_dropout_residual_layernorm(x, b, r, w, b, 0.1, philox, 1e-5))))
        rows.append(("bdrl fwd: fusekit.ops (philox drawn)", host_us(
            lambda: fk.bias_dropout_residual_layer_norm(x, b, r, w, b, 0.1))))
        rows.append(("bdrl fwd: PyTorch composition", host_us(
            lambda: F.layer_norm(r + F.dropout(x + b, 0.1), (64,), w, b, 1e-5))))
    rows.append(("layernorm fwd+bwd: fusekit.ops", host_us(with_backward(fk.layer_norm, (x, w, b)))))
    rows.append(("layernorm fwd+bwd: F.layer_norm", host_us(with_backward(
        lambda x, w, b: F.layer_norm(x, (64,), w, b), (x, w, b)))))
    rows.append(("bdrl fwd+bwd: fusekit.ops", host_us(with_backward(
        lambda x, r: fk.bias_dropout_residual_layer_norm(x, b, r, w, b, 0.1), (x, r)))))
    rows.append(("bdrl fwd+bwd: PyTorch composition", host_us(with_backward(
        lambda x, r: F.layer_norm(r + F.dropout(x + b, 0.1), (64,), w, b), (x, r)))))
    rows.append(("bias_gelu fwd+bwd: fusekit.ops", host_us(with_backward(lambda x: fk.bias_gelu(x, b), (x,)))))
    rows.append(("bias_gelu fwd+bwd: F.gelu(x + b)", host_us(with_backward(lambda x: F.gelu(x + b), (x,)))))
    rows.append(("bert_attention fwd+bwd: fusekit.ops", host_us(with_backward(
        lambda q: fk.bert_attention(q, lengths, 0.125, 0.1), (qkv,)))))
    for name, us in rows:
        print(f"{name:45s} {us:8.1f} us host per call")

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
    from ops import bert_step
    import fusekit.torch
    for patched in (False, True):
        model = bert_step.make_model("bert-base")
        if patched:
            fusekit.torch.patch(model, warn=False)
        optimizer = bert_step.make_optimizer(model)
        scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
        batches = bert_step.device_batches(64, 128)

        def step(i):
            optimizer.zero_grad(set_to_none=True)
            ids, types, mask, labels = batches[i % 4]
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        for i in range(5):
            step(i)
        torch.cuda.synchronize()
        hosts, gpus = [], []
        for i in range(10):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            t = time.perf_counter()
            step(i)
            hosts.append((time.perf_counter() - t) * 1e3)
            end.record()
            torch.cuda.synchronize()
            gpus.append(begin.elapsed_time(end))
        hosts.sort()
        gpus.sort()
        print(f"BERT-base step {'patched' if patched else 'unpatched'}: host {hosts[5]:.2f} ms to enqueue, "
              f"{gpus[5]:.2f} ms from first launch to last kernel (medians of 10)")
        # Where the host time goes: the ops (and Python autograd nodes) with the most self CPU
        # time over 3 steps, with their call counts.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(3):
                step(i)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
        del model, optimizer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
