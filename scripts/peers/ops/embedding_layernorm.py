"""BERT embedding-layer peers (vocabulary 30522, 512 positions, 2 token types, p = 0.1): three
F.embedding lookups added, F.layer_norm, F.dropout; forward and forward + backward through autograd."""
import torch
import torch.nn.functional as F

from .common import DTYPES, PeerCase, rotation_sets, uniform

VOCAB, POSITIONS, TYPES = 30522, 512, 2
EPS = 1e-12
P = 0.1


def embedding_layernorm(word_ids, position_ids, type_ids, word, position, token_type, gamma, beta, dy):
    if dy is not None:
        word, position, token_type, gamma, beta = (t.detach().requires_grad_(True)
                                                   for t in (word, position, token_type, gamma, beta))
    e = F.embedding(word_ids, word) + F.embedding(position_ids, position) + F.embedding(type_ids, token_type)
    y = F.dropout(F.layer_norm(e, (word.shape[-1],), gamma, beta, EPS), P, training=True)
    if dy is not None:
        y.backward(dy)
    return y


def make_case(case):
    tokens, hidden = (int(v) for v in case.shape.split("x"))
    dtype = DTYPES[case.dtype]
    backward = case.backward
    # The word table rotates with the ids: sets as suites/ops/embedding_layernorm.cpp sizes them,
    # from the bytes the case moves.
    sets = rotation_sets(int(case.bytes))
    inputs = {}

    def make_step(fn):
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
        return lambda s: fn(i["word_ids"][s], i["position_ids"], i["type_ids"][s], i["word"][s], i["position"],
                            i["token_type"], i["gamma"], i["beta"], i["dy"][s] if backward else None)

    return PeerCase(case.name, sets, make_step, embedding_layernorm, backward, release=inputs.clear)
