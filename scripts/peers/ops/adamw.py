"""AdamW peers: one optimizer step over a model's parameter tensors (direction "fwd" only).

eager:   torch.optim.AdamW(fused=True).step() on fp32 parameters, one tensor each. For fp16/bf16
         cases, the way AMP training steps: GradScaler(init_scale=1.0).step(optimizer) and update()
         around the fused optimizer, on fp32 parameters (the C++ baseline, baselines/adamw.h, runs
         the same ops). The scale is 1 because the fused kernel writes the unscaled gradients back:
         any other scale would shrink them towards zero over the repetitions.
compile: torch.compile of the same step function over torch.optim.AdamW(foreach=True), whose
         _foreach sequence inductor fuses (fused=True is one opaque kernel, nothing to compile).
         Under GradScaler a non-fused optimizer's step syncs on found_inf (.item()): a graph break
         that PyTorch itself takes.

The cases and their bytes come from fusekit's listing (suites/ops/adamw.cpp); the tensor lists
below build the same parameters. One input set: the state is updated in place, and the smallest
list moves 16x the L2 per step.
"""
import torch

from .common import PeerCase

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW's defaults


def bert_tensors(hidden, layers, intermediate):
    """BertForPreTraining's parameters without the next-sentence head (decoder weight tied)."""
    vocabulary, positions, token_types = 30522, 512, 2
    sizes = [vocabulary * hidden, positions * hidden, token_types * hidden, hidden, hidden]
    for _ in range(layers):
        sizes += [hidden * hidden, hidden] * 4  # query, key, value, attention output
        sizes += [hidden, hidden]  # attention LayerNorm
        sizes += [intermediate * hidden, intermediate, hidden * intermediate, hidden, hidden, hidden]
    sizes += [hidden * hidden, hidden]  # pooler
    sizes += [hidden * hidden, hidden, hidden, hidden, vocabulary]  # MLM transform, LayerNorm, decoder bias
    return sizes


def swin_t_tensors():
    """timm's swin_tiny_patch4_window7_224."""
    channels = 96
    sizes = [channels * 3 * 4 * 4, channels, channels, channels]
    for stage, (depth, heads) in enumerate(zip([2, 2, 6, 2], [3, 6, 12, 24])):
        c = channels
        for _ in range(depth):
            sizes += [c, c, 169 * heads, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c]
        if stage < 3:
            sizes += [4 * c, 4 * c, 2 * c * 4 * c]  # patch merging
            channels *= 2
    return sizes + [channels, channels, 1000 * channels, 1000]


TENSOR_LISTS = {
    "bert-base": lambda: bert_tensors(768, 12, 3072),
    "bert-large": lambda: bert_tensors(1024, 24, 4096),
    "swin-t": swin_t_tensors,
}


def adamw_step(optimizer, scaler):
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


def make_case(case):
    if case.backward:
        raise ValueError(f"{case.name}: an optimizer step has no backward")
    if case.shape not in TENSOR_LISTS:
        raise ValueError(f"unknown tensor list '{case.shape}': expected {', '.join(TENSOR_LISTS)}")
    sizes = TENSOR_LISTS[case.shape]()
    amp = case.dtype != "fp32"
    state = {}

    # A function per case, so that ops.py compiles each case's step once.
    def function(optimizer, scaler):
        adamw_step(optimizer, scaler)

    def make_step(fn):
        variant = "eager" if fn is function else "compile"
        if variant not in state:
            state.clear()  # one variant's tensors at a time
            torch.cuda.empty_cache()
            params = []
            for n in sizes:
                p = torch.nn.Parameter(torch.empty(n, device="cuda").uniform_(-0.02, 0.02))
                p.grad = torch.empty_like(p).uniform_(-1.0, 1.0)
                params.append(p)
            kind = {"fused": True} if variant == "eager" else {"foreach": True}
            optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kind)
            scaler = None
            if amp:
                scaler = torch.amp.GradScaler("cuda", init_scale=1.0)
                scaler.scale(torch.ones((), device="cuda"))  # creates its scale, as a first scaled loss does
            state[variant] = (optimizer, scaler)
        optimizer, scaler = state[variant]
        return lambda s: fn(optimizer, scaler)

    def release():
        state.clear()
        # The compiled step holds the optimizer it was traced with; let both go.
        torch._dynamo.reset()

    return PeerCase(case.name, 1, make_step, function, False, release=release)
