"""The Python package (python/fusekit) on a machine without a GPU, and without PyTorch where it is
absent (as in CI): the top-level package imports and says what is missing; fusekit.torch raises
one ImportError that says why; the rules that decide which modules fusekit.torch.patch fuses, on
stand-in modules of Hugging Face BERT's class names."""
import importlib
import os
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import fusekit  # noqa: E402
from fusekit import inductor, library, matching  # noqa: E402


def stand_in(kind, **attributes):
    """An object whose class is named `kind`, with the given attributes."""
    obj = type(kind, (), {})()
    obj.__dict__.update(attributes)
    return obj


def linear(bias=True):
    return stand_in("Linear", weight=object(), bias=object() if bias else None)


def layer_norm(affine=True):
    return stand_in("LayerNorm", weight=object() if affine else None, bias=object() if affine else None,
                    normalized_shape=(768,))


def attention(head_dim=64, **overrides):
    values = dict(attention_head_size=head_dim, is_decoder=False, is_causal=False, query=linear(), key=linear(),
                  value=linear(), config=stand_in("BertConfig", position_embedding_type="absolute"))
    values.update(overrides)
    return stand_in("BertSelfAttention", **values)


class LibraryTest(unittest.TestCase):
    def test_missing_names_pytorch_and_the_library(self):
        with tempfile.TemporaryDirectory() as root:
            reasons = library.missing(environ={}, root=root, have_module=lambda name: False)
        self.assertEqual(len(reasons), 2)
        self.assertIn("PyTorch is not installed", reasons[0])
        self.assertIn(library.LIBRARY_NAME + " was not found", reasons[1])
        self.assertIn(os.path.join("build-device", "torch_ops", library.LIBRARY_NAME), reasons[1])

    def test_library_found_in_a_build_folder_or_by_the_environment(self):
        with tempfile.TemporaryDirectory() as root:
            self.assertIsNone(library.find_library(environ={}, root=root))
            built = os.path.join(root, "build", "torch_ops", library.LIBRARY_NAME)
            os.makedirs(os.path.dirname(built))
            open(built, "w").close()
            self.assertEqual(library.find_library(environ={}, root=root), built)
            self.assertEqual(library.missing(environ={}, root=root, have_module=lambda name: True), [])
            chosen = os.path.join(root, "elsewhere.so")
            open(chosen, "w").close()
            environ = {library.ENVIRONMENT_VARIABLE: chosen}
            self.assertEqual(library.find_library(environ=environ, root=root), chosen)

    def test_fusekit_torch_says_why_it_cannot_import(self):
        if not library.missing():
            self.skipTest("PyTorch and the operator library are both here")
        with self.assertRaises(ImportError) as raised:
            importlib.import_module("fusekit.torch")
        message = str(raised.exception)
        self.assertTrue(message.startswith("fusekit.torch: "), message)
        self.assertTrue("PyTorch is not installed" in message or library.LIBRARY_NAME in message, message)

    def test_top_level_package_lists_what_is_missing(self):
        self.assertIsInstance(fusekit.missing(), list)


class InductorLogTest(unittest.TestCase):
    """fusekit.inductor on a stand-in of torch._inductor.exc: the implicit-fallback log line of a
    fusekit op no longer formats its arguments (IR trees whose printing grows with the model's
    depth); other operators keep PyTorch's text."""

    class Unprintable:
        def __str__(self):
            raise AssertionError("an argument of a fusekit op was printed")

        __repr__ = __str__

    class Op:
        def __init__(self, qualified):
            self.qualified = qualified

        def name(self):
            return self.qualified

        def __str__(self):
            return self.qualified.replace("::", ".") + ".default"

    def stand_in_exc(self):
        class OperatorIssue:
            @staticmethod
            def operator_str(target, args, kwargs):
                return f"target: {target}\n" + "\n".join(f"args[{i}]: {a}" for i, a in enumerate(args))

        class MissingOperatorWithoutDecomp(OperatorIssue):
            pass

        return type("exc", (), {"OperatorIssue": OperatorIssue,
                                "MissingOperatorWithoutDecomp": MissingOperatorWithoutDecomp})

    def test_fusekit_ops_are_named_not_printed(self):
        exc = self.stand_in_exc()
        self.assertTrue(inductor.bound_fallback_log(exc))
        error = exc.MissingOperatorWithoutDecomp  # graph.py calls it on the error class
        line = error.operator_str(self.Op("fusekit::layernorm"), (self.Unprintable(), self.Unprintable()), {"eps": 1})
        self.assertIn("fusekit.layernorm.default", line)
        self.assertIn("2 positional and 1 keyword arguments", line)
        self.assertEqual(error.operator_str(self.Op("aten::add"), ("x", "y"), {}),
                         "target: aten.add.default\nargs[0]: x\nargs[1]: y")
        with self.assertRaises(AssertionError):  # other operators' arguments are still printed
            error.operator_str(self.Op("aten::add"), (self.Unprintable(),), {})

    def test_in_place_once_and_absent_where_pytorch_has_no_such_method(self):
        exc = self.stand_in_exc()
        self.assertTrue(inductor.bound_fallback_log(exc))
        bounded = exc.OperatorIssue.operator_str
        self.assertTrue(inductor.bound_fallback_log(exc))
        self.assertIs(exc.OperatorIssue.operator_str, bounded)  # not wrapped twice
        self.assertFalse(inductor.bound_fallback_log(type("exc", (), {})))


class MatchingTest(unittest.TestCase):
    def test_supported_attention_is_fused(self):
        decision = matching.decide("bert.encoder.layer.0.attention.self", attention())
        self.assertEqual((decision.kind, decision.fused), ("BertSelfAttention", True))

    def test_attention_that_cannot_be_fused_is_kept_with_its_reason(self):
        for module, reason in [
            (attention(head_dim=48), "head_dim 48"),
            (attention(is_decoder=True), "decoder"),
            (attention(is_causal=True), "decoder"),
            (attention(config=stand_in("BertConfig", position_embedding_type="relative_key")), "relative"),
            (attention(key=linear(bias=False)), "without bias"),
        ]:
            decision = matching.decide("a", module)
            self.assertFalse(decision.fused, module.__dict__)
            self.assertIn(reason, decision.reason)

    def test_gelu_forms(self):
        self.assertEqual(matching.gelu_form(stand_in("GELUActivation")), "none")
        self.assertEqual(matching.gelu_form(stand_in("NewGELUActivation")), "tanh")
        self.assertEqual(matching.gelu_form(stand_in("PytorchGELUTanh")), "tanh")
        self.assertEqual(matching.gelu_form(stand_in("GELU", approximate="tanh")), "tanh")
        self.assertEqual(matching.gelu_form(stand_in("GELU", approximate="none")), "none")
        self.assertIsNone(matching.gelu_form(stand_in("ReLU")))

    def test_intermediate_needs_a_gelu(self):
        fused = matching.decide("i", stand_in("BertIntermediate", dense=linear(),
                                              intermediate_act_fn=stand_in("NewGELUActivation")))
        self.assertTrue(fused.fused)
        self.assertIn("tanh", fused.reason)
        kept = matching.decide("i", stand_in("BertIntermediate", dense=linear(), intermediate_act_fn=stand_in("SiLU")))
        self.assertFalse(kept.fused)
        self.assertIn("SiLU", kept.reason)

    def test_sublayer_outputs_need_an_affine_layer_norm(self):
        for kind in ("BertSelfOutput", "BertOutput"):
            self.assertTrue(matching.decide("o", stand_in(kind, dense=linear(), LayerNorm=layer_norm())).fused)
            kept = matching.decide("o", stand_in(kind, dense=linear(), LayerNorm=layer_norm(affine=False)))
            self.assertFalse(kept.fused)
            self.assertIn("LayerNorm", kept.reason)

    def test_embeddings(self):
        tables = dict(word_embeddings=object(), position_embeddings=object(), token_type_embeddings=object(),
                      LayerNorm=layer_norm())
        self.assertTrue(matching.decide("e", stand_in("BertEmbeddings", **tables)).fused)
        relative = matching.decide("e", stand_in("BertEmbeddings", position_embedding_type="relative_key", **tables))
        self.assertFalse(relative.fused)
        self.assertIn("relative", relative.reason)

    def bert_layer(self, **overrides):
        values = dict(attention=stand_in("BertAttention", self=attention(),
                                         output=stand_in("BertSelfOutput", dense=linear(), LayerNorm=layer_norm())),
                      intermediate=stand_in("BertIntermediate", dense=linear(),
                                            intermediate_act_fn=stand_in("GELUActivation")),
                      output=stand_in("BertOutput", dense=linear(), LayerNorm=layer_norm()),
                      add_cross_attention=False, chunk_size_feed_forward=0)
        values.update(overrides)
        layer = stand_in("BertLayer", **values)
        layer.attention.output.LayerNorm.eps = layer.output.LayerNorm.eps = 1e-12
        return layer

    def test_bert_layer_is_one_op_where_all_its_parts_fuse(self):
        decision = matching.decide("bert.encoder.layer.0", self.bert_layer())
        self.assertEqual((decision.kind, decision.fused), ("BertLayer", True))
        self.assertIn("one op per layer", decision.reason)
        self.assertIn("GELU (none)", decision.reason)
        for layer, reason in [
            (self.bert_layer(add_cross_attention=True), "cross-attention"),
            (self.bert_layer(chunk_size_feed_forward=64), "chunking"),
            (self.bert_layer(intermediate=stand_in("BertIntermediate", dense=linear(),
                                                   intermediate_act_fn=stand_in("SiLU"))), "intermediate: activation"),
            (self.bert_layer(output=stand_in("BertOutput", dense=linear(bias=False), LayerNorm=layer_norm())),
             "output: dense without bias"),
            (self.bert_layer(output=stand_in("BertGatedOutput", dense=linear(), LayerNorm=layer_norm())),
             "output is not a BertOutput"),
        ]:
            decision = matching.decide("l", layer)
            self.assertFalse(decision.fused, reason)
            self.assertIn(reason, decision.reason)
        layer = self.bert_layer()
        layer.attention.self.attention_head_size = 48
        self.assertIn("attention.self: head_dim 48", matching.decide("l", layer).reason)
        layer = self.bert_layer()
        layer.output.LayerNorm.eps = 1e-5
        self.assertIn("different eps", matching.decide("l", layer).reason)
        # A part that patch() already swapped counts as its original kind.
        layer = self.bert_layer()
        original = type(layer.output)
        layer.output.__class__ = type("FusedBertOutput", (original,), {"_fusekit_original": original})
        self.assertTrue(matching.decide("l", layer).fused)

    def test_unknown_and_known_unsupported_modules(self):
        self.assertIsNone(matching.decide("x", stand_in("BertPooler")))
        cross = matching.decide("x", stand_in("BertCrossAttention"))
        self.assertFalse(cross.fused)
        self.assertIn("cross-attention", cross.reason)

    def swin_block(self, **overrides):
        qkv = stand_in("Linear", weight=object(), bias=object(), out_features=3 * 96)
        attn = stand_in("WindowAttention", window_area=49, num_heads=3, qkv=qkv, proj=linear(),
                        attn_drop=stand_in("Dropout", p=0.0))
        mlp = stand_in("Mlp", fc1=linear(), fc2=linear(), act=stand_in("GELU", approximate="none"),
                       drop1=stand_in("Dropout", p=0.0), drop2=stand_in("Dropout", p=0.0), norm=stand_in("Identity"))
        values = dict(attn=attn, mlp=mlp, window_size=(7, 7), shift_size=(3, 3), dynamic_mask=False,
                      norm1=layer_norm(), norm2=layer_norm())
        values.update(overrides)
        return stand_in("SwinTransformerBlock", **values)

    def test_swin_block(self):
        decision = matching.decide("layers.0.blocks.1", self.swin_block())
        self.assertTrue(decision.fused, decision.reason)
        block = self.swin_block()
        block.attn.attn_drop.p = 0.1
        self.assertIn("attention dropout", matching.decide("b", block).reason)
        block = self.swin_block()
        block.attn.qkv.out_features = 3 * 144  # 3 heads of 48
        self.assertIn("head_dim 48", matching.decide("b", block).reason)
        block = self.swin_block()
        block.attn.window_area = 64
        self.assertIn("window of 64 tokens", matching.decide("b", block).reason)
        self.assertIn("not square", matching.decide("b", self.swin_block(window_size=(7, 8))).reason)
        block = self.swin_block()
        block.mlp.act = stand_in("SiLU")
        self.assertIn("SiLU", matching.decide("b", block).reason)
        block = self.swin_block()
        block.mlp.drop1.p = 0.1
        self.assertIn("MLP dropout", matching.decide("b", block).reason)

    def hf_swin_layer(self, **overrides):
        own = dict(query=linear(), key=linear(), value=linear(), relative_position_bias_table=object(),
                   relative_position_index=object(), attention_head_size=32, window_size=(7, 7))
        own.update(overrides.pop("own", {}))
        values = dict(attention=stand_in("SwinAttention", self=stand_in("SwinSelfAttention", **own),
                                         output=stand_in("SwinSelfOutput", dense=linear())),
                      layernorm_before=layer_norm(), layernorm_after=layer_norm(),
                      intermediate=stand_in("SwinIntermediate", dense=linear(),
                                            intermediate_act_fn=stand_in("GELUActivation")),
                      output=stand_in("SwinOutput", dense=linear()))
        values.update(overrides)
        return stand_in("SwinLayer", **values)

    def test_hugging_face_swin_layer(self):
        decision = matching.decide("swin.encoder.layers.0.blocks.0", self.hf_swin_layer())
        self.assertEqual((decision.kind, decision.fused), ("SwinLayer", True), decision.reason)
        self.assertIn("fusekit::swin_block", decision.reason)
        for layer, reason in [
            (self.hf_swin_layer(own=dict(key=linear(bias=False))), "qkv_bias=False"),
            (self.hf_swin_layer(own=dict(attention_head_size=48)), "head_dim 48"),
            (self.hf_swin_layer(own=dict(window_size=(8, 8))), "window (8, 8)"),
            (self.hf_swin_layer(own=dict(relative_position_bias_table=None)), "relative position bias"),
            (self.hf_swin_layer(layernorm_after=layer_norm(affine=False)), "layernorm_after"),
            (self.hf_swin_layer(intermediate=stand_in("SwinIntermediate", dense=linear(),
                                                      intermediate_act_fn=stand_in("ReLU"))), "ReLU"),
            (self.hf_swin_layer(output=stand_in("SwinOutput", dense=linear(bias=False))), "without bias"),
            (stand_in("SwinLayer", attention=stand_in("SwinAttention")), "neither of Hugging Face's"),
        ]:
            decision = matching.decide("l", layer)
            self.assertFalse(decision.fused, reason)
            self.assertIn(reason, decision.reason)
        parts = matching.hf_swin_parts(self.hf_swin_layer())
        self.assertFalse(parts.returns_pair)
        self.assertEqual((parts.head_dim, parts.scale), (32, 32 ** -0.5))

    def test_hugging_face_swin_layer_on_vit_layer(self):
        """The later layout (SwinLayer built on ViTLayer): q/k/v/o_proj, relative_position_bias,
        mlp, one dropout; the layer returns (output, attention weights)."""
        def layer(**overrides):
            bias = stand_in("SwinRelativePositionBias", relative_position_bias_table=object(),
                            relative_position_index=object(), window_size=(7, 7))
            attention = dict(q_proj=linear(), k_proj=linear(), v_proj=linear(), o_proj=linear(),
                             relative_position_bias=bias, num_attention_heads=3, head_dim=32, scaling=32 ** -0.5,
                             attention_dropout=0.0)
            attention.update(overrides.pop("attention", {}))
            values = dict(attention=stand_in("SwinAttention", **attention), layernorm_before=layer_norm(),
                          layernorm_after=layer_norm(), dropout=stand_in("Dropout", p=0.0),
                          mlp=stand_in("SwinMLP", fc1=linear(), fc2=linear(), activation_fn=stand_in("GELUActivation")))
            values.update(overrides)
            return stand_in("SwinLayer", **values)

        decision = matching.decide("swin.encoder.layers.0.blocks.0", layer())
        self.assertTrue(decision.fused, decision.reason)
        parts = matching.hf_swin_parts(layer(dropout=stand_in("Dropout", p=0.1)))
        self.assertTrue(parts.returns_pair)
        self.assertEqual((parts.heads, parts.head_dim, parts.dropouts), (3, 32, (0.0, 0.1)))
        self.assertIn("qkv_bias=False", matching.decide("l", layer(attention=dict(k_proj=linear(bias=False)))).reason)
        self.assertIn("head_dim 48", matching.decide("l", layer(attention=dict(head_dim=48))).reason)
        self.assertIn("window (12, 7)", matching.decide("l", layer(attention=dict(relative_position_bias=stand_in(
            "SwinRelativePositionBias", relative_position_bias_table=object(), relative_position_index=object(),
            window_size=(12, 7))))).reason)

    def test_patch_merging(self):
        norm = stand_in("LayerNorm", weight=object(), bias=object(), normalized_shape=(384,))

        def reduction(bias=False, in_features=384):
            return stand_in("Linear", weight=object(), bias=object() if bias else None, in_features=in_features)

        self.assertTrue(matching.decide("m", stand_in("PatchMerging", norm=norm, reduction=reduction())).fused)
        kept = matching.decide("m", stand_in("PatchMerging", norm=norm, reduction=reduction(bias=True)))
        self.assertFalse(kept.fused)
        self.assertIn("bias", kept.reason)
        # SwinV2's PatchMerging: reduction 4C -> 2C, then a norm over 2C.
        v2_norm = stand_in("LayerNorm", weight=object(), bias=object(), normalized_shape=(192,))
        v2 = matching.decide("m", stand_in("PatchMerging", norm=v2_norm, reduction=reduction()))
        self.assertFalse(v2.fused)
        self.assertIn("SwinV2", v2.reason)

    def test_the_caller_chooses_the_kinds(self):
        only = matching.kinds({"BertSelfAttention"}, "only=")
        self.assertTrue(matching.decide("a", attention(), only).fused)
        left = matching.decide("e", stand_in("BertCrossAttention"), only)
        self.assertEqual(left.reason, matching.KEPT["BertCrossAttention"])  # kept for its own reason
        swin_only = matching.kinds("PatchMerging", "only=")  # one name as a string
        self.assertEqual(swin_only, frozenset({"PatchMerging"}))
        out = matching.decide("a", attention(), swin_only)
        self.assertFalse(out.fused)
        self.assertIn("not in only=", out.reason)
        excluded = matching.decide("a", attention(), None, matching.kinds(["BertSelfAttention"], "exclude="))
        self.assertFalse(excluded.fused)
        self.assertIn("in exclude=", excluded.reason)
        # A kind fusekit cannot fuse (kept always, or unknown) is refused, named with the argument.
        for bad in ({"BertCrossAttention"}, ["BertSelfAttention", "Attention"]):
            with self.assertRaises(ValueError) as caught:
                matching.kinds(bad, "exclude=")
            self.assertIn("exclude= names", str(caught.exception))
            self.assertIn("it fuses: BertEmbeddings", str(caught.exception))
        self.assertIsNone(matching.kinds(None, "only="))
        # Classes stand for their names; anything else is a TypeError.
        self.assertEqual(matching.kinds([type("BertSelfAttention", (), {}), "PatchMerging"], "only="),
                         frozenset({"BertSelfAttention", "PatchMerging"}))
        with self.assertRaises(TypeError):
            matching.kinds([3], "only=")
        # patch()'s pair: an empty only= would fuse nothing, a kind in both contradicts itself.
        self.assertEqual(matching.selection(None, ()), (None, frozenset()))
        self.assertEqual(matching.selection(["PatchMerging"], None), (frozenset({"PatchMerging"}), frozenset()))
        with self.assertRaisesRegex(ValueError, "only= names no kind"):
            matching.selection(set(), ())
        with self.assertRaisesRegex(ValueError, "PatchMerging in both only= and exclude="):
            matching.selection({"PatchMerging", "BertOutput"}, ["PatchMerging"])

    def test_summary_counts_modules_per_decision(self):
        decisions = [matching.decide(f"l{i}", attention()) for i in range(12)] + [matching.decide("x", attention(48))]
        text = matching.summarize(decisions)
        self.assertIn("fused  12 x BertSelfAttention", text)
        self.assertIn("kept    1 x BertSelfAttention: head_dim 48", text)

    def test_summary_marks_the_parts_of_a_fused_layer_as_its_fallback(self):
        Decision = matching.Decision
        decisions = [Decision("", "BertForMaskedLM", True, "loss"),
                     Decision("bert.encoder.layer.0", "BertLayer", True, "one op"),
                     Decision("bert.encoder.layer.0.attention.self", "BertSelfAttention", True, "attn"),
                     Decision("bert.encoder.layer.1", "BertLayer", False, "kept"),
                     Decision("bert.encoder.layer.1.attention.self", "BertSelfAttention", True, "attn")]
        lines = matching.summarize(decisions).splitlines()
        self.assertIn("fused   1 x BertForMaskedLM: loss", lines)  # the root is no whole layer
        self.assertIn("fused   1 x BertSelfAttention: attn (inside a fused BertLayer: runs where a call cannot "
                      "take the BertLayer op)", lines)
        self.assertIn("fused   1 x BertSelfAttention: attn", lines)  # its layer was kept: it always runs


if __name__ == "__main__":
    unittest.main()
