"""fusekit.torch.patch on Hugging Face's Swin Transformer (transformers' SwinForImageClassification,
Swin-T's shape; pytest, GPU): every SwinLayer runs as fusekit::swin_block; one step's loss and every
parameter gradient against the unpatched model under AMP (within twice AMP's own error against
float32, as for timm's Swin and BERT); stochastic depth; state_dict unchanged."""
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "SwinForImageClassification"):
    pytest.skip("this transformers has no Swin", allow_module_level=True)

import fusekit.ops  # noqa: E402
import fusekit.torch  # noqa: E402

DEVICE = "cuda"
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make_model(seed=0, drop_path=0.0):
    config = transformers.SwinConfig(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
                                     num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=drop_path,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=100)
    torch.manual_seed(seed)
    return transformers.SwinForImageClassification(config).to(DEVICE).train()


def make_batch(batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 224, 224, generator=g)
    labels = torch.randint(0, 100, (batch,), generator=g)
    return images.to(DEVICE), labels.to(DEVICE)


def loss_and_grads(model, batch, dtype=None, scale=1024.0):
    model.zero_grad(set_to_none=True)
    images, labels = batch
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = F.cross_entropy(model(pixel_values=images).logits.float(), labels, label_smoothing=0.1)
    (loss * scale).backward()
    return loss.item(), {n: p.grad.double() / scale for n, p in model.named_parameters() if p.grad is not None}


def relative(a, b, floor):
    return ((a - b).norm() / b.norm().clamp_min(max(floor, 1e-30))).item()


@pytest.fixture
def calls(monkeypatch):
    seen = []
    original = fusekit.ops.swin_block

    def counted(*args, **kwargs):
        seen.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(fusekit.ops, "swin_block", counted)
    return seen


def test_patch_fuses_every_layer_and_keeps_the_state_dict():
    model = make_model()
    keys = list(model.state_dict())
    report = fusekit.torch.patch(model)
    assert [d.kind for d in report.fused()].count("SwinLayer") == 12, str(report)
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_step_gradients_match_the_unpatched_model(dtype, calls):
    batch = make_batch()
    model = make_model()
    ref_loss, ref = loss_and_grads(model, batch)
    amp_loss, amp = loss_and_grads(model, batch, dtype)
    fusekit.torch.patch(model)
    fused_loss, fused = loss_and_grads(model, batch, dtype)
    assert len(calls) == 12, calls
    assert set(fused) == set(ref)
    assert abs(fused_loss - ref_loss) <= max(2 * abs(amp_loss - ref_loss), FLOOR[dtype] * abs(ref_loss))
    floor = 1e-3 * sum(g.norm().item() for g in ref.values()) / len(ref)
    worst = max((relative(fused[n], ref[n], floor) / max(2 * relative(amp[n], ref[n], floor), FLOOR[dtype]), n)
                for n in ref)
    print(f"{dtype}: worst gradient ratio to the bound {worst[0]:.3f} ({worst[1]})")
    assert worst[0] <= 1.0, worst


def test_stochastic_depth_takes_the_op(calls):
    model = make_model(drop_path=0.1)
    fusekit.torch.patch(model)
    assert model.swin.encoder.layers[0].blocks[1]._fusekit_drop_path_branches in (1, 2)
    loss, grads = loss_and_grads(model, make_batch(), torch.float16)
    assert len(calls) == 12 and all(torch.isfinite(g).all() for g in grads.values())
    model.eval()  # no stochastic depth: the same loss twice
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        a, b = (model(pixel_values=make_batch()[0]).logits for _ in range(2))
    assert torch.equal(a, b)
