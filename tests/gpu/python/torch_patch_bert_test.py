"""fusekit.torch.patch on Hugging Face's BertForMaskedLM (pytest, GPU): what is fused; one step's
loss and every parameter gradient against the unpatched model; 10 training steps; torch.compile;
state_dict round trips; a mask that is not key padding on the right stops the program. The
gradient rule against the unpatched model: patch_checks.py.
"""
import functools
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fusekit.torch  # noqa: E402
from patch_checks import (DEVICE, assert_within_amp_error, count_calls, gradient_floor, loss_bound,  # noqa: E402
                          relative)
import patch_checks  # noqa: E402


def make_model(layers=2, dropout=0.0, seed=0, act="gelu"):
    config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=layers,
                                     num_attention_heads=12, intermediate_size=3072, hidden_act=act,
                                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                                     max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                                     pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.BertForMaskedLM(config).to(DEVICE).train()


def make_batch(batch=8, seq=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    lengths[0] = seq
    ids = torch.randint(1, 30522, (batch, seq), generator=g)
    keep = torch.arange(seq)[None, :] < lengths[:, None]
    ids = torch.where(keep, ids, torch.zeros_like(ids))
    labels = torch.full((batch, seq), -100)
    chosen = (torch.rand(batch, seq, generator=g) < 0.15) & keep
    labels[chosen] = ids[chosen]
    types = (torch.arange(seq)[None, :] >= (lengths[:, None] // 2)).long() * keep
    return {k: v.to(DEVICE) for k, v in dict(input_ids=ids, attention_mask=keep.long(), token_type_ids=types,
                                             labels=labels).items()}


def bert_loss(model, batch):
    return model(**batch).loss


loss_and_grads = functools.partial(patch_checks.loss_and_grads, loss_of=bert_loss)


def test_patch_reports_what_it_fused():
    model = make_model()
    report = fusekit.torch.patch(model)
    fused = {d.kind for d in report.fused()}
    assert fused == {"BertEmbeddings", "BertLayer", "BertSelfAttention", "BertSelfOutput", "BertOutput",
                     "BertIntermediate", "BertPredictionHeadTransform", "BertForMaskedLM"}, str(report)
    assert len(report.fused()) == 1 + 2 * 5 + 2  # embeddings, the layer and its 4 parts, head transform, the loss
    assert "FusedBertSelfAttention" in repr(model)
    assert fusekit.torch.unpatch(model) == len(report.fused())
    assert "Fused" not in repr(model)


def test_only_and_exclude_choose_the_kinds_fused(recwarn):
    model = make_model()
    report = fusekit.torch.patch(model, only={"BertSelfAttention"})
    assert [d.kind for d in report.fused()] == ["BertSelfAttention"] * 2, str(report)
    assert all("not in only=" in d.reason for d in report.kept()), str(report)
    assert not [w for w in recwarn if "fusekit" in str(w.message)]  # a kind left out is no warning
    fusekit.torch.unpatch(model)
    report = fusekit.torch.patch(model, exclude=["BertForMaskedLM", "BertEmbeddings"])
    assert {d.kind for d in report.kept()} == {"BertForMaskedLM", "BertEmbeddings"}, str(report)
    assert len(report.fused()) == 2 * 5 + 1
    # One step's loss within the whole patch's bound (test_one_step_gradients_match_the_unpatched_model).
    batch = make_batch()
    patched_loss, _ = loss_and_grads(model, batch, torch.float16)
    fusekit.torch.unpatch(model)
    ref_loss, _ = loss_and_grads(model, batch)
    amp_loss, _ = loss_and_grads(model, batch, torch.float16)
    bound = loss_bound(ref_loss, amp_loss, torch.float16)
    assert abs(patched_loss - ref_loss) <= bound
    with pytest.raises(ValueError, match="only= names 'BertAttention'"):
        fusekit.torch.patch(model, only={"BertAttention"})
    assert "Fused" not in repr(model)


def test_each_encoder_layer_runs_as_one_op(monkeypatch):
    """Under autocast every BertLayer takes fusekit::bert_layer (one call per layer and step); with
    exclude={"BertLayer"} none does, and both patched models' losses agree within AMP's bound."""
    calls = count_calls(monkeypatch, "bert_layer")
    batch = make_batch()
    model = make_model(layers=3)
    ref_loss, _ = loss_and_grads(model, batch)
    amp_loss, _ = loss_and_grads(model, batch, torch.float16)
    fusekit.torch.patch(model)
    layer_loss, grads = loss_and_grads(model, batch, torch.float16)
    assert len(calls) == 3, calls
    assert all(g.dtype == torch.float64 and torch.isfinite(g).all() for g in grads.values())
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    fusekit.torch.unpatch(model)
    fusekit.torch.patch(model, exclude={"BertLayer"})
    per_op_loss, _ = loss_and_grads(model, batch, torch.float16)
    assert len(calls) == 3
    bound = loss_bound(ref_loss, amp_loss, torch.float16)
    assert abs(layer_loss - ref_loss) <= bound and abs(per_op_loss - ref_loss) <= bound


def test_unsupported_head_dim_is_kept_with_a_warning():
    config = transformers.BertConfig(hidden_size=96, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=384)  # head_dim 48
    model = transformers.BertForMaskedLM(config).to(DEVICE)
    with pytest.warns(UserWarning, match="head_dim 48"):
        report = fusekit.torch.patch(model)
    assert [d.kind for d in report.kept()] == ["BertLayer", "BertSelfAttention"], str(report)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_step_gradients_match_the_unpatched_model(dtype):
    batch = make_batch()
    model = make_model()
    ref = loss_and_grads(model, batch)  # unpatched float32
    amp = loss_and_grads(model, batch, dtype)  # unpatched AMP
    fusekit.torch.patch(model)
    fp32_loss, fp32 = loss_and_grads(model, batch)  # patched float32: the fused ops in float32
    fused = loss_and_grads(model, batch, dtype)  # patched AMP
    ref_loss, ref_grads = ref
    assert abs(fp32_loss - ref_loss) <= 1e-4 * abs(ref_loss)
    floor = gradient_floor(ref_grads)
    for name in ref_grads:
        assert relative(fp32[name], ref_grads[name], floor) < 1e-3, f"{name}: float32 patched vs unpatched"
    assert_within_amp_error(dtype, ref, amp, fused)


def train(model, steps, dtype, seed):
    return patch_checks.train(model, steps, dtype, loss_of=bert_loss,
                              batch_of=lambda step: make_batch(seed=100 + step % 3), seed=seed)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_ten_steps_track_the_unpatched_loss(dropout):
    unpatched = train(make_model(dropout=dropout), 10, torch.float16, seed=3)
    model = make_model(dropout=dropout)
    fusekit.torch.patch(model)
    patched = train(model, 10, torch.float16, seed=3)
    # Without dropout both compute one function (AMP rounding apart); with it, other masks.
    tolerance = 0.01 if dropout == 0 else 0.03
    for step, (a, b) in enumerate(zip(unpatched, patched)):
        assert abs(a - b) <= tolerance * abs(a), f"step {step}: unpatched {a:.4f}, patched {b:.4f}"
    assert patched[-1] < patched[0]


def graph_breaks(model, batch):
    """Graph breaks Dynamo reports while compiling one forward of the model."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        torch.compile(model)(**batch)
    return sum(counters["graph_break"].values())


def test_compiled_patched_model_matches_eager():
    batch = make_batch()
    model = make_model()
    unpatched_breaks = graph_breaks(model, batch)
    fusekit.torch.patch(model)
    patched_breaks = graph_breaks(model, batch)
    print(f"graph breaks: unpatched {unpatched_breaks}, patched {patched_breaks}")
    assert patched_breaks <= unpatched_breaks  # fusekit's ops are traced as opaque ops, no break of their own
    eager_loss, eager = loss_and_grads(model, batch, torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    compiled_loss, graph = loss_and_grads(model, batch, torch.float16, call=compiled)
    assert abs(compiled_loss - eager_loss) <= 2e-3 * abs(eager_loss)
    floor = gradient_floor(eager)
    for name in eager:
        assert relative(graph[name], eager[name], floor) < 2e-2, name


def test_state_dict_round_trip():
    model = make_model()
    keys = list(model.state_dict().keys())
    fusekit.torch.patch(model)
    assert list(model.state_dict().keys()) == keys
    other = make_model(seed=9)
    other.load_state_dict(model.state_dict())  # patched -> unpatched
    batch = make_batch()
    fusekit.torch.patch(other)
    model.eval()
    other.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, other(**batch).logits)
    fresh = make_model(seed=11)
    fusekit.torch.patch(fresh)
    fresh.load_state_dict(other.state_dict())  # patched -> patched
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, fresh(**batch).logits)


def test_left_padding_stops_with_a_device_assert():
    code = (
        "import torch, transformers, fusekit.torch\n"
        "c = transformers.BertConfig(num_hidden_layers=1)\n"
        "m = transformers.BertForMaskedLM(c).cuda()\n"
        "fusekit.torch.patch(m)\n"
        "ids = torch.ones(2, 16, dtype=torch.long, device='cuda')\n"
        "mask = torch.ones(2, 16, dtype=torch.long, device='cuda'); mask[1, :4] = 0\n"
        "with torch.autocast('cuda', dtype=torch.float16):\n"
        "    m(input_ids=ids, attention_mask=mask).logits.sum().item()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                            timeout=300)
    assert result.returncode != 0
    assert "key padding on the right" in result.stderr or "device-side assert" in result.stderr, \
        result.stderr[-2000:]
