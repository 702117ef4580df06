"""fusekit.torch.patch on Hugging Face's Swin Transformer (transformers' SwinForImageClassification,
Swin-T's shape; pytest, GPU): every SwinLayer runs as fusekit::swin_block; one step's loss and every
parameter gradient against the unpatched model under AMP (within twice AMP's own error against
float32, as for timm's Swin and BERT); stochastic depth; state_dict unchanged."""
import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "SwinForImageClassification"):
    pytest.skip("this transformers has no Swin", allow_module_level=True)

import fusekit.torch  # noqa: E402
from patch_checks import DEVICE, assert_within_amp_error, count_calls, image_batch, image_loss  # noqa: E402
import patch_checks  # noqa: E402


def make_model(seed=0, drop_path=0.0):
    config = transformers.SwinConfig(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
                                     num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=drop_path,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=100)
    torch.manual_seed(seed)
    return transformers.SwinForImageClassification(config).to(DEVICE).train()


def swin_loss(model, batch):
    images, labels = batch
    return image_loss(model(pixel_values=images).logits, labels)


loss_and_grads = functools.partial(patch_checks.loss_and_grads, loss_of=swin_loss)


@pytest.fixture
def calls(monkeypatch):
    return count_calls(monkeypatch, "swin_block")


def test_patch_fuses_every_layer_and_keeps_the_state_dict():
    model = make_model()
    keys = list(model.state_dict())
    report = fusekit.torch.patch(model)
    assert [d.kind for d in report.fused()].count("SwinLayer") == 12, str(report)
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_step_gradients_match_the_unpatched_model(dtype, calls):
    batch = image_batch()
    model = make_model()
    ref = loss_and_grads(model, batch)
    amp = loss_and_grads(model, batch, dtype)
    fusekit.torch.patch(model)
    fused = loss_and_grads(model, batch, dtype)
    assert len(calls) == 12, calls
    assert_within_amp_error(dtype, ref, amp, fused)


def test_stochastic_depth_takes_the_op(calls):
    model = make_model(drop_path=0.1)
    fusekit.torch.patch(model)
    assert model.swin.encoder.layers[0].blocks[1]._fusekit_drop_path_branches in (1, 2)
    loss, grads = loss_and_grads(model, image_batch(), torch.float16)
    assert len(calls) == 12 and all(torch.isfinite(g).all() for g in grads.values())
    model.eval()  # no stochastic depth: the same loss twice
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        a, b = (model(pixel_values=image_batch()[0]).logits for _ in range(2))
    assert torch.equal(a, b)
