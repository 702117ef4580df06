"""Cross-entropy peers: F.cross_entropy over logits (label smoothing 0.1, ignore_index -100, about 10%
of the labels ignored, reduction "mean"), forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform

SMOOTHING = 0.1
IGNORE_INDEX = -100
IGNORED_SHARE = 0.1


def labels_for(rows: int, vocab: int):
    labels = torch.randint(0, vocab, (rows,), device="cuda")
    return labels.masked_fill(torch.rand(rows, device="cuda") < IGNORED_SHARE, IGNORE_INDEX)


def cross_entropy(logits, labels, dloss):
    if dloss is None:
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, label_smoothing=SMOOTHING)
    logits = logits.detach().requires_grad_(True)
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, label_smoothing=SMOOTHING)
    loss.backward(dloss)
    return loss


def make_case(case):
    rows, vocab = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    size = torch.finfo(dtype).bits // 8
    backward = case.backward
    sets = rotation_sets(rows * vocab * size * (2 if backward else 1))
    inputs = {}

    def make_step(fn):
        if not inputs:
            inputs["logits"] = [uniform((rows, vocab), dtype, 4.0) for _ in range(sets)]
            inputs["labels"] = [labels_for(rows, vocab) for _ in range(sets)]
            # The gradient of the mean loss, in the loss's dtype (as fusekit's baseline).
            inputs["dloss"] = torch.ones((), dtype=dtype, device="cuda") if backward else None
        i = inputs
        return lambda s: fn(i["logits"][s], i["labels"][s], i["dloss"])

    return PeerCase(case.name, sets, make_step, cross_entropy, backward, release=inputs.clear)
