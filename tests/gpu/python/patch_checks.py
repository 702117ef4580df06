"""What the fusekit.torch.patch tests (BERT, timm's Swin, Hugging Face's Swin) share: one step's
loss and gradients, the gradient rule against the unpatched model, counting an op's calls, and a
short training run. Each test file supplies its model's loss as `loss_of(model, batch)`.

Gradient rule (DESIGN.md: a patched model against the unpatched one): per parameter, the patched
model's relative error against the unpatched float32 run is at most twice the unpatched AMP run's
error against it, with FLOOR as the least bound, for tensors that AMP happens to compute almost
exactly; the loss likewise.
"""
import torch
import torch.nn.functional as F

import fusekit.ops

DEVICE = "cuda"
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def loss_and_grads(model, batch, dtype=None, *, loss_of, call=None, scale=1024.0):
    """One forward and backward of `call` (default: the model itself, e.g. its compiled wrapper)
    under autocast in `dtype` (float32 without autocast where None); the loss, and every
    parameter's gradient in float64 with the loss scale taken out."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = loss_of(call if call is not None else model, batch)
    (loss * scale).backward()
    return loss.item(), {n: p.grad.double() / scale for n, p in model.named_parameters() if p.grad is not None}


def relative(a, b, floor=0.0):
    """||a - b|| / ||b||, the denominator at least `floor`: a gradient that is zero in exact
    arithmetic (a key projection's bias: softmax ignores a constant added to every score) is
    rounding noise, which only a floor on the scale makes comparable."""
    return ((a - b).norm() / b.norm().clamp_min(max(floor, 1e-30))).item()


def gradient_floor(grads):
    """1e-3 of the mean gradient norm over the parameters."""
    return 1e-3 * sum(g.norm().item() for g in grads.values()) / len(grads)


def loss_bound(ref_loss, amp_loss, dtype):
    """How far an AMP loss may be from the float32 one: twice the unpatched AMP run's distance."""
    return max(2 * abs(amp_loss - ref_loss), FLOOR[dtype] * abs(ref_loss))


def assert_within_amp_error(dtype, ref, amp, fused):
    """ref, amp, fused: (loss, gradients) of the unpatched float32, unpatched AMP and patched AMP
    runs. Asserts the rule above for the loss and every parameter, and prints the worst one."""
    (ref_loss, ref_grads), (amp_loss, amp_grads), (fused_loss, fused_grads) = ref, amp, fused
    assert set(fused_grads) == set(ref_grads)
    assert abs(fused_loss - ref_loss) <= loss_bound(ref_loss, amp_loss, dtype), (fused_loss, amp_loss, ref_loss)
    floor = gradient_floor(ref_grads)
    worst = []
    for name in ref_grads:
        bound = max(2 * relative(amp_grads[name], ref_grads[name], floor), FLOOR[dtype])
        error = relative(fused_grads[name], ref_grads[name], floor)
        worst.append((error / bound, name, error, bound))
    ratio, name, error, bound = max(worst)
    print(f"{dtype}: worst gradient {name}: error {error:.3g}, bound {bound:.3g}")
    assert ratio <= 1.0, f"{name}: error {error:.3g} > bound {bound:.3g}"


def count_calls(monkeypatch, op):
    """Wraps fusekit.ops.<op> for the test; returns the list that gets each call's first argument's
    shape."""
    calls = []
    original = getattr(fusekit.ops, op)

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(fusekit.ops, op, counted)
    return calls


def train(model, steps, dtype, *, loss_of, batch_of, seed=None):
    """`steps` AMP training steps (fused AdamW, lr 1e-4; GradScaler in fp16) on batch_of(step);
    the losses. `seed`, where given, seeds PyTorch's generator first (dropout's masks)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=dtype == torch.float16)
    if seed is not None:
        torch.manual_seed(seed)
    losses = []
    for step in range(steps):
        batch = batch_of(step)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_of(model, batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


def image_batch(batch=4, seed=1, classes=100):
    """Random 224 x 224 images and labels, on the GPU, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 224, 224, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    return images.to(DEVICE), labels.to(DEVICE)


def image_loss(logits, labels):
    """The Swin tests' loss: cross-entropy with label smoothing 0.1, in float32."""
    return F.cross_entropy(logits.float(), labels, label_smoothing=0.1)
