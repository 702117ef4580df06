"""Swin training-step peers: one whole image-classification step (forward, backward, AdamW) of
timm's Swin Transformer under AMP, as a user writes it, on fusekit's cases (suites/ops/swin_step.cpp,
suite "models"; direction "fwd" only: a step is one case per shape and dtype).

Model: timm.create_model of the preset's name (swin-t: swin_tiny_patch4_window7_224, swin-b:
swin_base_patch4_window7_224), 1000 classes, drop_path_rate 0 (stochastic depth off, as the fused
step will be), made after torch.manual_seed(1) by timm's initializer, fp32 parameters on the GPU,
train mode. Loss: cross-entropy with label smoothing 0.1 in float32 on the logits.
Data: two sets of random images (N(0, 1), 224 x 224) and labels (seed 0), copied to the GPU once;
set index s runs set s.
Step: zero_grad(set_to_none=True); the loss under torch.autocast("cuda", dtype); fp16: GradScaler
(init_scale 1024) scales it, backward, scaler.step, scaler.update(); bf16: backward, step.
Optimizer: torch.optim.AdamW(fused=True), lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.05
on every parameter but biases, norms and the relative position bias tables (timm's recipe).

eager, compile: timm's model (compile: torch.compile of the function returning the loss, as
bert_step does); fusekit, fusekit-compile: the same after fusekit.torch.patch (each block one op,
fusekit::swin_block, and patch merging fused; python/fusekit), where fusekit.torch imports; eager-fp32: timm's model in
float32 throughout, TF32 off for matrix products and convolutions, no loss scaling (the fp32
baseline that the Swin talk's speedups are quoted against: AMP 1.63x, fused LayerNorm + Adam 2.11x,
fused window ops 2.19x, fused attention 2.85x).
Each variant starts afresh from the same seeded weights; its peak memory is stored with it.
Ranges: swin.step > swin.forward, swin.backward, swin.optimizer, and in the eager variants the
forward's stages and blocks as the fused step names them (mark_stages).
"""
import gc
import sys

import torch
import torch.nn.functional as F

from .bert_step import fusekit_torch, graphs_compiled
from .common import DTYPES, PeerCase

PRESETS = {"swin-t": "swin_tiny_patch4_window7_224", "swin-b": "swin_base_patch4_window7_224"}
IMAGE, CLASSES, SETS, DATA_SEED, WEIGHT_SEED = 224, 1000, 2, 0, 1
LR, BETAS, EPS, WEIGHT_DECAY, LABEL_SMOOTHING = 1e-3, (0.9, 0.999), 1e-8, 0.05, 0.1


def parse(shape: str):
    """"<preset>[:b<batch>]" -> (preset, batch)."""
    preset, *fields = shape.split(":")
    if preset not in PRESETS:
        raise ValueError(f"swin_step: unknown model '{preset}' in '{shape}' (known: {', '.join(PRESETS)})")
    batch = 1
    for field in fields:
        if field[:1] != "b" or not field[1:].isdigit() or int(field[1:]) < 1:
            raise ValueError(f"swin_step: bad field '{field}' in '{shape}' (expected b<batch>)")
        batch = int(field[1:])
    return preset, batch


def make_model(preset: str):
    try:
        import timm
    except ImportError as e:
        raise RuntimeError(f"swin_step: the peer needs timm ({e})") from None
    torch.manual_seed(WEIGHT_SEED)
    model = timm.create_model(PRESETS[preset], pretrained=False, num_classes=CLASSES, drop_path_rate=0.0)
    return model.to("cuda").train()


def mark_stages(model):
    """NVTX ranges around the forward of timm's patch embedding, each stage's downsample and blocks
    and the head, named as the fused step's (swin.patch_embed, swin.stage.S.downsample,
    swin.stage.S.block.B, swin.head), so that the report puts the eager peers' per-stage shares
    beside the fused and baseline steps'. Forward hooks only: the backward's kernels come from
    autograd's thread and are placed in swin.backward by time. Eager variants only (torch.compile
    would trace the hooks). A model without timm's layout is left unmarked, with a line on stderr."""
    nvtx = torch.cuda.nvtx

    # A hook that returns something replaces the module's input (pre) or output: range_push and
    # range_pop return the nesting depth, so the hooks return None themselves.
    def push(name):
        def hook(*_):
            nvtx.range_push(name)
        return hook

    def pop(*_):
        nvtx.range_pop()

    def mark(module, name):
        module.register_forward_pre_hook(push(name))
        module.register_forward_hook(pop)

    try:
        mark(model.patch_embed, "swin.patch_embed")
        for s, stage in enumerate(model.layers):
            if not isinstance(stage.downsample, torch.nn.Identity):
                mark(stage.downsample, f"swin.stage.{s}.downsample")
            for b, block in enumerate(stage.blocks):
                mark(block, f"swin.stage.{s}.block.{b}")
        mark(model.head, "swin.head")
    except AttributeError as e:
        print(f"swin_step: per-stage ranges left out ({e})", file=sys.stderr)


def make_optimizer(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        plain = p.ndim <= 1 or name.endswith(".bias") or "relative_position_bias_table" in name
        (no_decay if plain else decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)


def make_case(case):
    if case.backward:
        raise ValueError(f"{case.name}: a training step is one case, direction fwd (it holds its backward)")
    if case.dtype not in ("fp16", "bf16"):
        raise ValueError(f"{case.name}: swin_step is fp16 or bf16 (AMP)")
    preset, batch = parse(case.shape)
    amp_dtype = DTYPES[case.dtype]
    state, sets = {}, []

    def function(model, images, labels):
        with torch.autocast("cuda", dtype=amp_dtype):
            logits = model(images)
        return F.cross_entropy(logits.float(), labels, label_smoothing=LABEL_SMOOTHING)

    def function_fp32(model, images, labels):
        return F.cross_entropy(model(images), labels, label_smoothing=LABEL_SMOOTHING)

    def make_step(fn, variant=None):
        variant = variant or ("eager" if fn is function else "compile")
        state.clear()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if not sets:
            g = torch.Generator().manual_seed(DATA_SEED)
            for _ in range(SETS):
                images = torch.randn(batch, 3, IMAGE, IMAGE, generator=g)
                labels = torch.randint(0, CLASSES, (batch,), generator=g)
                sets.append((images.to("cuda"), labels.to("cuda")))
        model = make_model(preset)
        if variant.startswith("fusekit"):
            report = fusekit_torch().patch(model, warn=False)
            print(f"swin_step: {case.name} [peer:{variant}]: fusekit.torch.patch:\n{report}", file=sys.stderr)
        if not variant.endswith("compile"):
            mark_stages(model)
        optimizer = make_optimizer(model)
        fp32 = variant == "eager-fp32"
        if fp32:
            fn = function_fp32
        scaler = torch.amp.GradScaler("cuda", init_scale=1024.0) if amp_dtype == torch.float16 and not fp32 else None
        state.update(model=model, optimizer=optimizer, scaler=scaler, steps=0, graphs=None, variant=variant)
        run = state

        def step(s):
            model, optimizer, scaler = run["model"], run["optimizer"], run["scaler"]
            nvtx = torch.cuda.nvtx
            nvtx.range_push("swin.step")
            if fp32:  # TF32 off for this step only: the other variants run under PyTorch's defaults
                tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
                try:
                    run_step(s, model, optimizer, scaler, nvtx)
                finally:
                    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
            else:
                run_step(s, model, optimizer, scaler, nvtx)
            nvtx.range_pop()
            run["steps"] += 1
            if run["steps"] == 1 and run["variant"].endswith("compile"):
                run["graphs"] = graphs_compiled()

        def run_step(s, model, optimizer, scaler, nvtx):
            with torch.enable_grad():
                optimizer.zero_grad(set_to_none=True)
                nvtx.range_push("swin.forward")
                loss = fn(model, *sets[s % SETS])
                nvtx.range_pop()
                nvtx.range_push("swin.backward")
                (loss if scaler is None else scaler.scale(loss)).backward()
                nvtx.range_pop()
                nvtx.range_push("swin.optimizer")
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.step(optimizer)
                    scaler.update()
                nvtx.range_pop()

        return step

    def release():
        torch._dynamo.reset()
        state.clear()
        sets.clear()
        gc.collect()

    def metrics():
        torch.cuda.synchronize()
        return {"peak_memory_bytes": torch.cuda.max_memory_reserved()}

    # eager-fp32 last: the largest footprint, so that running out of memory there costs no other variant.
    extra = (("fusekit", "fusekit-compile") if fusekit_torch() is not None else ()) + ("eager-fp32",)
    return PeerCase(case.name, SETS, make_step, function, False, release=release, metrics=metrics,
                    extra_variants=extra)
