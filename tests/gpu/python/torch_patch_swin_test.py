"""fusekit.torch.patch on timm's Swin Transformer (pytest, GPU): what is fused; one step's loss
and every parameter gradient against the unpatched model under AMP (within twice AMP's own error
against float32, as for BERT); 10 training steps; torch.compile; state_dict round trip."""
import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")

import fusekit.torch  # noqa: E402

DEVICE = "cuda"
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make_model(seed=0, drop_path=0.0):
    torch.manual_seed(seed)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=100,
                              drop_path_rate=drop_path)
    return model.to(DEVICE).train()


def make_batch(batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 224, 224, generator=g)
    labels = torch.randint(0, 100, (batch,), generator=g)
    return images.to(DEVICE), labels.to(DEVICE)


def loss_and_grads(model, batch, dtype=None, scale=1024.0):
    model.zero_grad(set_to_none=True)
    images, labels = batch
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = F.cross_entropy(model(images).float(), labels, label_smoothing=0.1)
    (loss * scale).backward()
    return loss.item(), {n: p.grad.double() / scale for n, p in model.named_parameters() if p.grad is not None}


def relative(a, b, floor):
    return ((a - b).norm() / b.norm().clamp_min(max(floor, 1e-30))).item()


def test_patch_reports_what_it_fused():
    model = make_model()
    report = fusekit.torch.patch(model)
    kinds = [d.kind for d in report.fused()]
    assert kinds.count("SwinTransformerBlock") == 12 and kinds.count("PatchMerging") == 3, str(report)
    assert not report.kept(), str(report)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_step_gradients_match_the_unpatched_model(dtype):
    batch = make_batch()
    model = make_model()
    ref_loss, ref = loss_and_grads(model, batch)
    amp_loss, amp = loss_and_grads(model, batch, dtype)
    fusekit.torch.patch(model)
    fused_loss, fused = loss_and_grads(model, batch, dtype)
    assert set(fused) == set(ref)
    assert abs(fused_loss - ref_loss) <= max(2 * abs(amp_loss - ref_loss), FLOOR[dtype] * abs(ref_loss))
    floor = 1e-3 * sum(g.norm().item() for g in ref.values()) / len(ref)
    worst = max((relative(fused[n], ref[n], floor) / max(2 * relative(amp[n], ref[n], floor), FLOOR[dtype]), n)
                for n in ref)
    print(f"{dtype}: worst gradient ratio to the bound {worst[0]:.3f} ({worst[1]})")
    assert worst[0] <= 1.0, worst


def test_each_block_runs_as_one_op(monkeypatch):
    """Every block takes fusekit::swin_block under autocast (12 calls a step for Swin-T), with
    stochastic depth too; with BLOCK_OP off, the per-op path; the block op's and the per-op path's
    losses agree within AMP's bound."""
    calls = []
    original = fusekit.ops.swin_block

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(fusekit.ops, "swin_block", counted)
    batch = make_batch()
    model = make_model()
    ref_loss, _ = loss_and_grads(model, batch)
    amp_loss, _ = loss_and_grads(model, batch, torch.float16)
    fusekit.torch.patch(model)
    block_loss, grads = loss_and_grads(model, batch, torch.float16)
    assert len(calls) == 12, calls
    assert all(torch.isfinite(g).all() for g in grads.values())
    monkeypatch.setattr(fusekit.torch.swin, "BLOCK_OP", False)
    per_op_loss, _ = loss_and_grads(model, batch, torch.float16)
    assert len(calls) == 12
    bound = max(2 * abs(amp_loss - ref_loss), FLOOR[torch.float16] * abs(ref_loss))
    assert abs(block_loss - ref_loss) <= bound and abs(per_op_loss - ref_loss) <= bound
    monkeypatch.setattr(fusekit.torch.swin, "BLOCK_OP", True)
    dropping = make_model(drop_path=0.1)
    fusekit.torch.patch(dropping)
    loss, grads = loss_and_grads(dropping, batch, torch.float16)
    assert len(calls) == 24 and all(torch.isfinite(g).all() for g in grads.values())


def train(model, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    losses = []
    for step in range(steps):
        images, labels = make_batch(seed=100 + step % 3)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(images).float(), labels, label_smoothing=0.1)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


def test_ten_steps_track_the_unpatched_loss():
    unpatched = train(make_model(), 10)
    model = make_model()
    fusekit.torch.patch(model)
    patched = train(model, 10)
    for step, (a, b) in enumerate(zip(unpatched, patched)):
        assert abs(a - b) <= 0.01 * abs(a), f"step {step}: unpatched {a:.4f}, patched {b:.4f}"


def test_compiled_patched_model_matches_eager():
    batch = make_batch()
    model = make_model()
    fusekit.torch.patch(model)
    eager_loss, eager = loss_and_grads(model, batch, torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(compiled(batch[0]).float(), batch[1], label_smoothing=0.1)
    (loss * 1024.0).backward()
    assert abs(loss.item() - eager_loss) <= 2e-3 * abs(eager_loss)
    floor = 1e-3 * sum(g.norm().item() for g in eager.values()) / len(eager)
    for name, p in model.named_parameters():
        assert relative(p.grad.double() / 1024.0, eager[name], floor) < 2e-2, name


def test_state_dict_round_trip():
    model = make_model()
    keys = list(model.state_dict().keys())
    fusekit.torch.patch(model)
    assert list(model.state_dict().keys()) == keys
    other = make_model(seed=5)
    other.load_state_dict(model.state_dict())
    fusekit.torch.patch(other)
    model.eval()
    other.eval()
    images, _ = make_batch()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        assert torch.equal(model(images), other(images))
