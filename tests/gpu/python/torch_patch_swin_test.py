"""fusekit.torch.patch on timm's Swin Transformer (pytest, GPU): what is fused; one step's loss
and every parameter gradient against the unpatched model under AMP (within twice AMP's own error
against float32, as for BERT); 10 training steps; torch.compile; state_dict round trip."""
import functools

import pytest
import torch

timm = pytest.importorskip("timm")

import fusekit.torch  # noqa: E402
from patch_checks import (DEVICE, assert_within_amp_error, count_calls, gradient_floor,  # noqa: E402
                          image_batch, image_loss, loss_bound, relative)
import patch_checks  # noqa: E402


def make_model(seed=0, drop_path=0.0):
    torch.manual_seed(seed)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=100,
                              drop_path_rate=drop_path)
    return model.to(DEVICE).train()


def swin_loss(model, batch):
    images, labels = batch
    return image_loss(model(images), labels)


loss_and_grads = functools.partial(patch_checks.loss_and_grads, loss_of=swin_loss)


def test_patch_reports_what_it_fused():
    model = make_model()
    report = fusekit.torch.patch(model)
    kinds = [d.kind for d in report.fused()]
    assert kinds.count("SwinTransformerBlock") == 12 and kinds.count("PatchMerging") == 3, str(report)
    assert not report.kept(), str(report)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_step_gradients_match_the_unpatched_model(dtype):
    batch = image_batch()
    model = make_model()
    ref = loss_and_grads(model, batch)
    amp = loss_and_grads(model, batch, dtype)
    fusekit.torch.patch(model)
    assert_within_amp_error(dtype, ref, amp, loss_and_grads(model, batch, dtype))


def test_each_block_runs_as_one_op(monkeypatch):
    """Every block takes fusekit::swin_block under autocast (12 calls a step for Swin-T), with
    stochastic depth too; with BLOCK_OP off, the per-op path; the block op's and the per-op path's
    losses agree within AMP's bound."""
    calls = count_calls(monkeypatch, "swin_block")
    batch = image_batch()
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
    bound = loss_bound(ref_loss, amp_loss, torch.float16)
    assert abs(block_loss - ref_loss) <= bound and abs(per_op_loss - ref_loss) <= bound
    monkeypatch.setattr(fusekit.torch.swin, "BLOCK_OP", True)
    dropping = make_model(drop_path=0.1)
    fusekit.torch.patch(dropping)
    loss, grads = loss_and_grads(dropping, batch, torch.float16)
    assert len(calls) == 24 and all(torch.isfinite(g).all() for g in grads.values())


def train(model, steps):
    return patch_checks.train(model, steps, torch.float16, loss_of=swin_loss,
                              batch_of=lambda step: image_batch(seed=100 + step % 3))


def test_ten_steps_track_the_unpatched_loss():
    unpatched = train(make_model(), 10)
    model = make_model()
    fusekit.torch.patch(model)
    patched = train(model, 10)
    for step, (a, b) in enumerate(zip(unpatched, patched)):
        assert abs(a - b) <= 0.01 * abs(a), f"step {step}: unpatched {a:.4f}, patched {b:.4f}"


def test_compiled_patched_model_matches_eager():
    batch = image_batch()
    model = make_model()
    fusekit.torch.patch(model)
    eager_loss, eager = loss_and_grads(model, batch, torch.float16)
    torch._dynamo.reset()
    compiled_loss, graph = loss_and_grads(model, batch, torch.float16, call=torch.compile(model))
    assert abs(compiled_loss - eager_loss) <= 2e-3 * abs(eager_loss)
    floor = gradient_floor(eager)
    for name in eager:
        assert relative(graph[name], eager[name], floor) < 2e-2, name


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
    images, _ = image_batch()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        assert torch.equal(model(images), other(images))
