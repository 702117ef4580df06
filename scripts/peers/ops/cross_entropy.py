"""Cross-entropy peers: F.cross_entropy over logits (label smoothing 0.1, ignore_index -100, about 10%
of the labels ignored, reduction "mean"), forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "cross_entropy"
# The suite's shapes (suites/ops/cross_entropy.cpp): rows x vocabulary.
SHAPES = ["8192x30522", "1280x30522", "8192x50257", "4096x65536", "128x1000", "128x21841"]
SMOOTHING = 0.1
IGNORE_INDEX = -100
IGNORED_SHARE = 0.1


def bytes_moved(rows: int, vocab: int, size: int, backward: bool) -> float:
    """As fusekit counts them: forward reads logits and int64 labels, writes float losses and
    logsumexp; backward reads logits, labels and logsumexp, writes dlogits."""
    forward = rows * vocab * size + rows * 8 + 2 * rows * 4
    back = rows * vocab * size + rows * 8 + rows * 4 + rows * vocab * size
    return forward + back if backward else forward


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


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                rows, vocab = (int(v) for v in shape.split("x"))
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                sets = rotation_sets(rows * vocab * size * (2 if backward else 1))
                inputs = {}

                def make_step(fn, rows=rows, vocab=vocab, dtype=dtype, sets=sets, backward=backward, inputs=inputs):
                    if not inputs:
                        inputs["logits"] = [uniform((rows, vocab), dtype, 4.0) for _ in range(sets)]
                        inputs["labels"] = [labels_for(rows, vocab) for _ in range(sets)]
                        # The gradient of the mean loss, in the loss's dtype (as fusekit's baseline).
                        inputs["dloss"] = torch.ones((), dtype=dtype, device="cuda") if backward else None
                    i = inputs
                    return lambda s: fn(i["logits"][s], i["labels"][s], i["dloss"])

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(rows, vocab, size, backward), sets, make_step, cross_entropy, backward,
                               release=inputs.clear)
