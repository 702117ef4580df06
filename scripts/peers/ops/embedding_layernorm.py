"""BERT embedding-layer peers (vocabulary 30522, 512 positions, 2 token types, p = 0.1): three
F.embedding lookups added, F.layer_norm, F.dropout; forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, case_name, rotation_sets, uniform

NAME = "embedding_layernorm"
# The suite's shapes (suites/ops/embedding_layernorm.cpp): tokens x hidden.
SHAPES = ["8192x768", "16384x768", "8192x1024", "16384x1024"]
VOCAB, POSITIONS, TYPES = 30522, 512, 2
EPS = 1e-12
P = 0.1


def bytes_moved(tokens: int, hidden: int, size: int, backward: bool) -> float:
    # As fusekit counts them: the forward reads three int64 ids, a gathered word row per token, the
    # position rows in use and both token-type rows once, gamma, beta and writes y, mean, rstd; the
    # backward reads dy, the ids, the same rows again, gamma, mean, rstd and writes every row of the
    # three table gradients, dgamma, dbeta.
    n = tokens * hidden
    ids, stats = 3 * 8 * tokens, 2 * 4 * tokens
    small_tables = (min(tokens, POSITIONS) + TYPES) * hidden * size
    forward = ids + n * size + small_tables + 2 * hidden * size + n * size + stats
    back = n * size + ids + n * size + small_tables + hidden * size + stats \
        + (VOCAB + POSITIONS + TYPES) * hidden * size + 2 * hidden * size
    return forward + back if backward else forward


def embedding_layernorm(word_ids, position_ids, type_ids, word, position, token_type, gamma, beta, dy):
    if dy is not None:
        word, position, token_type, gamma, beta = (t.detach().requires_grad_(True)
                                                   for t in (word, position, token_type, gamma, beta))
    e = F.embedding(word_ids, word) + F.embedding(position_ids, position) + F.embedding(type_ids, token_type)
    y = F.dropout(F.layer_norm(e, (word.shape[-1],), gamma, beta, EPS), P, training=True)
    if dy is not None:
        y.backward(dy)
    return y


def cases(dtypes, directions, shapes=None):
    for dtype_name in dtypes:
        for backward in directions:
            for shape in shapes or SHAPES:
                tokens, hidden = (int(v) for v in shape.split("x"))
                dtype = DTYPES[dtype_name]
                size = torch.finfo(dtype).bits // 8
                # The word table rotates with the ids (as suites/ops/embedding_layernorm.cpp does).
                sets = rotation_sets(int(bytes_moved(tokens, hidden, size, backward)))
                inputs = {}

                def make_step(fn, tokens=tokens, hidden=hidden, dtype=dtype, sets=sets, backward=backward,
                              inputs=inputs):
                    if not inputs:
                        positions = torch.arange(tokens, device="cuda") % POSITIONS
                        inputs["word_ids"] = [torch.randint(0, VOCAB, (tokens,), device="cuda") for _ in range(sets)]
                        inputs["type_ids"] = [torch.randint(0, TYPES, (tokens,), device="cuda") for _ in range(sets)]
                        inputs["position_ids"] = positions
                        inputs["dy"] = [uniform((tokens, hidden), dtype) for _ in range(sets)] if backward else None
                        inputs["word"] = [uniform((VOCAB, hidden), dtype, 0.1) for _ in range(sets)]
                        inputs["position"] = uniform((POSITIONS, hidden), dtype, 0.1)
                        inputs["token_type"] = uniform((TYPES, hidden), dtype, 0.1)
                        inputs["gamma"] = uniform(hidden, dtype, 0.2, 1.0)
                        inputs["beta"] = uniform(hidden, dtype, 0.1)
                    i = inputs
                    return lambda s: fn(i["word_ids"][s], i["position_ids"], i["type_ids"][s], i["word"][s],
                                        i["position"], i["token_type"], i["gamma"], i["beta"],
                                        i["dy"][s] if backward else None)

                yield PeerCase(case_name(NAME, shape, dtype_name, backward), NAME, shape, dtype_name,
                               bytes_moved(tokens, hidden, size, backward), sets, make_step, embedding_layernorm,
                               backward, release=inputs.clear)
