"""fusekit inside PyTorch: patch a model's modules with fused equivalents.

    import fusekit.torch
    report = fusekit.torch.patch(model)   # in place; returns what was fused and what was kept
    fusekit.torch.patch(model, only={"BertSelfAttention"})   # on an unpatched model (unpatch() first):
                                                             # those kinds only; or exclude={...}
    print(report)
    fusekit.torch.unpatch(model)          # back to the original classes
    optimizer = fusekit.torch.AdamW(model.parameters(), lr=1e-4)   # fusekit's AdamW kernel

Supported: Hugging Face BERT (BertModel, BertForMaskedLM, BertForPreTraining,
BertForSequenceClassification and the other heads share its modules), timm's SwinTransformer
(its blocks and patch merging) and Hugging Face's Swin (SwinModel and its heads: its SwinLayers).
A BERT encoder layer runs as one op (fusekit::bert_layer), its parts fused one by one where a call
cannot take it; a Swin block as one op (fusekit::swin_block). Patching swaps each matched module's
class for a subclass with a fused forward; parameters, buffers and state_dict keys are untouched.
A module that cannot be fused exactly is kept, with a warning saying why.
"""

import importlib.util
import warnings

from fusekit import matching
from fusekit.library import missing

if importlib.util.find_spec("torch") is None or missing():
    raise ImportError("fusekit.torch: " + "; ".join(missing()))

from fusekit.torch import bert, swin  # noqa: E402 (after the check that makes its import errors readable)
from fusekit.torch.optim import AdamW  # noqa: E402

FUSED = {**bert.FUSED, **swin.FUSED}

_FUSED_CLASSES = {}


class Report(list):
    """The decisions of one patch call (fusekit.matching.Decision), printable as a summary."""

    def fused(self):
        return [d for d in self if d.fused]

    def kept(self):
        return [d for d in self if not d.fused]

    def __str__(self):
        return matching.summarize(self) if self else "fusekit: no module of a supported model found"


def _fused_class(original, kind):
    key = (original, kind)
    if key not in _FUSED_CLASSES:
        mixin = FUSED[kind]
        attributes = {"_fusekit_original": original, "__module__": mixin.__module__}
        # Constants a fused forward reads (FusedBertLayer, FusedSwinLayer), set once per class.
        if hasattr(mixin, "_fusekit_class_attributes"):
            attributes.update(mixin._fusekit_class_attributes(original))
        _FUSED_CLASSES[key] = type("Fused" + original.__name__, (mixin, original), attributes)
    return _FUSED_CLASSES[key]


def patch(model, warn=True, only=None, exclude=()):
    """Replace, in place, the modules of `model` that fusekit fuses; returns a Report. `only` (module
    class names, e.g. {"BertSelfAttention"}) fuses those kinds alone, `exclude` all but those (as
    Liger Kernel's per-kernel switches): to keep what a compiler already fuses well, or to find which
    replacement a difference comes from. Names or the classes themselves; a kind fusekit does not
    fuse, an empty only= and a kind in both are ValueErrors."""
    only, exclude = matching.selection(only, exclude)
    report = Report()
    for path, module in model.named_modules():
        if getattr(type(module), "_fusekit_original", None) is not None:
            continue  # patched already
        decision = matching.decide(path, module, only, exclude)
        if decision is None:
            continue
        report.append(decision)
        if decision.fused:
            module.__class__ = _fused_class(type(module), decision.kind)
        elif warn and not decision.reason.startswith("left out by the caller"):
            warnings.warn(f"fusekit: kept {path or 'the model'} ({decision.kind}): {decision.reason}", stacklevel=2)
    return report


def unpatch(model):
    """Restore the original classes of every module patch() replaced; returns how many."""
    restored = 0
    for module in model.modules():
        original = getattr(type(module), "_fusekit_original", None)
        if original is not None:
            module.__class__ = original
            restored += 1
    return restored


__all__ = ["patch", "unpatch", "Report", "AdamW"]
