"""BERT training-step peers: one whole masked-LM step (forward, backward, AdamW) of Hugging Face's
BertForMaskedLM under AMP, as a user writes it, on fusekit's cases (suites/ops/bert_step.cpp, suite
"models"; direction "fwd" only: a step is one case per shape and dtype, as an optimizer step is).

Model: transformers.BertForMaskedLM(BertConfig(...)) of the preset (models/bert_config.h), with
hidden_act "gelu_pytorch_tanh" (the tanh-form GELU that every fusekit variant computes,
models/bert_model.h), dropout 0.1 on hidden states and attention probabilities, LayerNorm eps 1e-12,
the decoder tied to the word embeddings (BertForMaskedLM has no pooler). Parameters fp32, made after
torch.manual_seed(1) by Hugging Face's initializer (normal(0, 0.02) matrices and tables, zero biases,
LayerNorm 1 and 0: the distribution of models/bert_init.h, another generator), on the GPU, train mode.
Attention: the default implementation, what a user gets: "sdpa" where PyTorch has it (transformers
picks it by default), i.e. F.scaled_dot_product_attention with the key-padding mask, whose dispatcher
takes a fused kernel that accepts a mask and dropout (memory-efficient or cuDNN; flash takes no mask).
The implementation in use is printed to stderr per case. In eager mode transformers asks whether the
padding mask is all ones (padding_mask.all() as a Python bool), a device synchronization per step
that is part of what a user gets; under torch.compile that check is skipped (tracing).

Data: batches 0..3 of mlm_data.make_mlm_batch (seed 0), as fusekit's suite: input_ids,
token_type_ids, attention_mask (1 where position < length) and labels (-100 elsewhere), int64, copied
to the GPU once; set index s runs batch s (the driver rotates s through the 4 sets).

Step (the timed repetition): zero_grad(set_to_none=True); loss = model(...).loss under
torch.autocast("cuda", dtype); fp16: GradScaler(init_scale=1024: fusekit's static loss scale; the
other settings PyTorch's defaults, so it would only grow after 2000 clean steps) scales the loss,
backward, scaler.step(optimizer) (the fused AdamW takes the scale and the inf flag into its kernel:
no host sync), scaler.update(); bf16: no scaler, loss.backward(), optimizer.step().
Optimizer: torch.optim.AdamW(fused=True), lr 1e-4, betas (0.9, 0.999), eps 1e-6 (BertTrainOptions),
weight decay 0.01 on every parameter but the biases and the LayerNorm parameters (group of decay 0).

eager:   the above.
compile: torch.compile (the driver's: default mode, dynamic=False) of the function that returns the
         loss: the model's forward, autocast and the cross-entropy; AOTAutograd traces the joint graph
         and Inductor compiles its forward and its backward, which loss.backward() runs. The loss
         scaling, the inf check, the fused AdamW, scaler.update() and zero_grad stay eager.
         Compiled once per case: the driver resets Dynamo and wraps `function` once for the variant;
         every call passes the same model and tensors of one shape, with grad mode on and the
         parameters' grads None, so the guards hold on every set. The first call (in the driver's
         warm-up, before any timed sample) compiles the forward and the backward. Should Dynamo
         compile anything after that first step, a line on stderr says so when the variant ends.

fusekit, fusekit-compile: the same model after fusekit.torch.patch (python/fusekit: the embeddings, each
         encoder layer as one op (fusekit::bert_layer: its GEMMs, attention, bias + dropout + residual +
         LayerNorm and bias + GELU on fusekit's kernels), the head's transform and the loss as fusekit
         ops; the head's GEMMs stay PyTorch's), eager and under torch.compile as
         above (fusekit's ops are opaque to Inductor). Run where fusekit.torch imports (the operator
         library built, PYTHONPATH holding python/); otherwise a line on stderr says why they are skipped.

Each variant starts afresh from the same seeded weights and a new optimizer; the previous variant's
model is freed first. flops come from fusekit's listing (the fused step's count: the head on the
masked rows only; this peer computes every row of the head, like the libtorch baseline).
"""
import gc
import os
import sys

import torch

from mlm_data import make_mlm_batch  # scripts/peers/mlm_data.py (ops.py puts scripts/peers on the path)

from .common import DTYPES, PeerCase

# models/bert_config.h's presets: layers, hidden, heads, intermediate.
PRESETS = {
    "bert-base": (12, 768, 12, 3072),
    "bert-large": (24, 1024, 16, 4096),
    "bert-tiny": (2, 128, 2, 512),
}
VOCAB, POSITIONS, TOKEN_TYPES = 30522, 512, 2
LAYER_NORM_EPS, DROPOUT = 1e-12, 0.1
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-6, 0.01  # models/bert_model.h BertTrainOptions
FP16_LOSS_SCALE = 1024.0  # BertTrainOptions::effective_loss_scale for fp16
BATCHES, DATA_SEED, WEIGHT_SEED = 4, 0, 1  # suites/ops/bert_step.cpp: kBatches, the data's and weights' seeds


def parse(shape: str):
    """"<preset>[:b<batch>][:s<sequence>]" (models/bert_config.h, without the dtype) -> (preset, batch, sequence)."""
    preset, *fields = shape.split(":")
    if preset not in PRESETS:
        raise ValueError(f"bert_step: unknown model '{preset}' in '{shape}' (known: {', '.join(PRESETS)})")
    values = {"b": 1, "s": 128}
    seen = set()
    for field in fields:
        key, digits = field[:1], field[1:]
        if key not in values or key in seen or not digits.isdigit() or int(digits) < 1:
            raise ValueError(f"bert_step: bad field '{field}' in '{shape}' (expected b<batch>, s<sequence>, once each)")
        seen.add(key)
        values[key] = int(digits)
    if values["s"] > POSITIONS:
        raise ValueError(f"bert_step: sequence {values['s']} > {POSITIONS} positions in '{shape}'")
    return preset, values["b"], values["s"]


def device_batches(batch: int, sequence: int):
    """The suite's 4 batches as (input_ids, token_type_ids, attention_mask, labels) on the GPU."""
    out = []
    positions = torch.arange(sequence)
    for index in range(BATCHES):
        raw = make_mlm_batch(batch, sequence, index, seed=DATA_SEED, vocab=VOCAB)
        lengths = torch.tensor(raw["lengths"], dtype=torch.long)
        attention_mask = (positions[None, :] < lengths[:, None]).long()
        ids, types, labels = (torch.tensor(raw[k], dtype=torch.long) for k in ("input_ids", "token_type_ids", "labels"))
        tensors = (ids, types, attention_mask, labels)
        out.append(tuple(t.to("cuda") for t in tensors))
    return out


_fusekit_torch = []


def fusekit_torch():
    """fusekit.torch (python/ of this checkout), or None where it does not import (the reason on
    stderr, once)."""
    if _fusekit_torch:
        return _fusekit_torch[0]
    python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python")
    if os.path.isdir(python) and python not in sys.path:
        sys.path.insert(0, os.path.normpath(python))
    try:
        import fusekit.torch
        _fusekit_torch.append(fusekit.torch)
    except ImportError as e:
        print(f"bert_step: the fusekit variants are skipped: {e}", file=sys.stderr)
        _fusekit_torch.append(None)
    return _fusekit_torch[0]


def make_model(preset: str):
    try:
        from transformers import BertConfig, BertForMaskedLM
    except ImportError as e:
        raise RuntimeError(f"bert_step: the peer needs Hugging Face transformers ({e})") from None
    layers, hidden, heads, intermediate = PRESETS[preset]
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=intermediate, hidden_act="gelu_pytorch_tanh",
                        hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT,
                        max_position_embeddings=POSITIONS, type_vocab_size=TOKEN_TYPES, layer_norm_eps=LAYER_NORM_EPS,
                        pad_token_id=0)
    torch.manual_seed(WEIGHT_SEED)  # the weights, and then the dropout masks, repeat from run to run
    model = BertForMaskedLM(config).to("cuda")  # fp32 parameters (AMP); default attention implementation
    model.train()
    return model


def make_optimizer(model):
    """Fused AdamW, BERT's recipe: no weight decay on biases and LayerNorm parameters."""
    norm = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # each shared (tied) parameter once
        if p.requires_grad:
            (no_decay if name.endswith("bias") or id(p) in norm else decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)


def graphs_compiled() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def make_case(case):
    if case.backward:
        raise ValueError(f"{case.name}: a training step is one case, direction fwd (it holds its backward)")
    if case.dtype not in ("fp16", "bf16"):
        raise ValueError(f"{case.name}: bert_step is fp16 or bf16 (AMP)")
    preset, batch, sequence = parse(case.shape)
    amp_dtype = DTYPES[case.dtype]
    state, batches = {}, []

    # The function torch.compile wraps: the model's forward and its loss, under autocast. Backward
    # and the optimizer step are make_step's, outside it.
    def function(model, input_ids, token_type_ids, attention_mask, labels):
        with torch.autocast("cuda", dtype=amp_dtype):
            return model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                         labels=labels).loss

    def make_step(fn, variant=None):
        variant = variant or ("eager" if fn is function else "compile")
        # One variant's model at a time: the previous variant's step reaches its model only through
        # `state`, so clearing it frees the model, its gradients and the optimizer's state.
        report_recompiles()
        state.clear()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()  # the variant's peak: metrics() below
        if not batches:
            batches.extend(device_batches(batch, sequence))
        model = make_model(preset)
        attention = getattr(model.config, "_attn_implementation", None)
        print(f"bert_step: {case.name} [peer:{variant}]: attention implementation {attention}", file=sys.stderr)
        if variant.startswith("fusekit"):
            report = fusekit_torch().patch(model)
            print(f"bert_step: {case.name} [peer:{variant}]: fusekit.torch.patch:\n{report}", file=sys.stderr)
        optimizer = make_optimizer(model)
        scaler = torch.amp.GradScaler("cuda", init_scale=FP16_LOSS_SCALE) if amp_dtype == torch.float16 else None
        state.update(model=model, optimizer=optimizer, scaler=scaler, steps=0, graphs=None, variant=variant)
        run = state

        def step(s):
            model, optimizer, scaler = run["model"], run["optimizer"], run["scaler"]
            # The NVTX ranges of fusekit's variants (models/): bert.step > bert.forward / bert.backward /
            # bert.optimizer. Backward runs on autograd's thread; fusekit's reports place its kernels
            # in bert.backward by time.
            nvtx = torch.cuda.nvtx
            nvtx.range_push("bert.step")
            # The driver times a "fwd" case under no_grad; a training step needs autograd.
            with torch.enable_grad():
                optimizer.zero_grad(set_to_none=True)
                nvtx.range_push("bert.forward")
                loss = fn(model, *batches[s])
                nvtx.range_pop()
                nvtx.range_push("bert.backward")
                (loss if scaler is None else scaler.scale(loss)).backward()
                nvtx.range_pop()
                nvtx.range_push("bert.optimizer")
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.step(optimizer)
                    scaler.update()
                nvtx.range_pop()
            nvtx.range_pop()
            run["steps"] += 1
            if run["steps"] == 1 and run["variant"].endswith("compile"):
                run["graphs"] = graphs_compiled()  # forward and backward compiled by now

        return step

    def report_recompiles():
        """A line on stderr if Dynamo compiled anything after the compile variant's first step."""
        if state.get("variant", "").endswith("compile") and state.get("graphs") is not None:
            more = graphs_compiled() - state["graphs"]
            if more > 0:
                print(f"bert_step: {case.name} [peer:{state['variant']}]: Dynamo compiled {more} graph(s) after the first "
                      f"step (recompiles): its samples may include compilation", file=sys.stderr)

    def release():
        report_recompiles()
        torch._dynamo.reset()  # the compiled function's cache may hold the model it was traced with
        state.clear()
        batches.clear()
        gc.collect()

    def metrics():
        """The most memory PyTorch's allocator held for this variant (model, optimizer, batches, a
        step's activations): what the C++ variants' peak_memory_bytes measures for them."""
        torch.cuda.synchronize()
        return {"peak_memory_bytes": torch.cuda.max_memory_reserved()}

    extra = ("fusekit", "fusekit-compile") if fusekit_torch() is not None else ()
    return PeerCase(case.name, BATCHES, make_step, function, False, release=release, metrics=metrics,
                    extra_variants=extra)
