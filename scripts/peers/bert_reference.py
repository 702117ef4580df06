"""Hugging Face's BertForMaskedLM, one forward and backward in fp32: the reference of fusekit's BERT steps.

Builds transformers' BertForMaskedLM of the given sizes with hidden_act "gelu_pytorch_tanh" (the GELU
every fusekit variant computes, models/bert_model.h), no dropout and eager attention, loads a state
dict (.safetensors with Hugging Face's names, as models/bert_checkpoint.h's save_bert_safetensors
writes it), runs batch --batch-index of a batches file (models/mlm_data.h's write_mlm_batches) forward
and backward in fp32 on the GPU, with the attention mask of the batch's lengths, and writes the loss
("loss", F32 [1]) and every parameter's gradient (Hugging Face's names, F32) to --output:

  python3 scripts/peers/bert_reference.py --weights w.safetensors --batches b.safetensors \\
      --layers 2 --hidden 128 --heads 2 --intermediate 512 --vocab 30522 --max-positions 512 \\
      --output reference.safetensors

Bad input (a missing or unreadable file, a batch the sizes do not allow, a state dict the model does
not match, no GPU, a missing package) is one line on standard error and exit status 1; usage errors
exit with 2. The inputs are checked before torch is imported.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mlm_data import IGNORE, read_batches  # noqa: E402 (after the path is set)

# The tied decoder's tensors are the word embeddings and cls.predictions.bias under other names: a
# state dict may hold either name of each (both must then be equal).
WORD = "bert.embeddings.word_embeddings.weight"
TIED = (("cls.predictions.decoder.weight", WORD), ("cls.predictions.decoder.bias", "cls.predictions.bias"))
# Tensors a state dict may hold that BertForMaskedLM does not load: BertForPreTraining's pooler and
# next-sentence head, and the buffers older transformers versions saved.
IGNORED_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")
BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


class InputError(Exception):
    pass


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"bert_reference: {message} (--help for usage)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, help="state dict (.safetensors, Hugging Face names)")
    parser.add_argument("--batches", required=True, help="batches file of write_mlm_batches (.safetensors)")
    parser.add_argument("--batch-index", type=int, default=0, help="the batch of the file to run (default 0)")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--intermediate", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--max-positions", type=int, required=True)
    parser.add_argument("--token-types", type=int, default=2)
    parser.add_argument("--layer-norm-eps", type=float, default=1e-12)
    parser.add_argument("--output", required=True, help="where the loss and the gradients go (.safetensors)")
    return parser.parse_args(argv)


def check_sizes(args):
    for name in ("layers", "hidden", "heads", "intermediate", "vocab", "max_positions", "token_types"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.hidden % args.heads:
        raise InputError(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if not args.layer_norm_eps > 0:
        raise InputError(f"--layer-norm-eps must be positive, not {args.layer_norm_eps}")


def load_batch(args):
    """The batch --batch-index of the file, checked against the sizes: a dict of lists."""
    try:
        _, batches = read_batches(args.batches)
    except OSError as e:
        raise InputError(f"{args.batches}: {e.strerror}") from e
    except Exception as e:  # a file of another kind: bad header, bad dtype, bad names
        raise InputError(f"{args.batches}: not a batches file of write_mlm_batches ({e!r})") from e
    if args.batch_index not in batches:
        raise InputError(f"{args.batches}: no batch {args.batch_index} (it holds {sorted(batches)})")
    batch = batches[args.batch_index]
    for field in ("input_ids", "token_type_ids", "labels", "lengths"):
        if field not in batch:
            raise InputError(f"{args.batches}: batch {args.batch_index} has no {field}")
    if not batch["input_ids"] or not isinstance(batch["input_ids"][0], list) or not batch["input_ids"][0]:
        raise InputError(f"{args.batches}: batch {args.batch_index}'s input_ids is not [batch, sequence]")
    rows, sequence = len(batch["input_ids"]), len(batch["input_ids"][0])
    if sequence > args.max_positions:
        raise InputError(f"{args.batches}: sequences of {sequence} tokens, --max-positions is {args.max_positions}")
    for field in ("token_type_ids", "labels"):
        if len(batch[field]) != rows or any(len(row) != sequence for row in batch[field]):
            raise InputError(f"{args.batches}: {field} is not {rows} x {sequence} like input_ids")
    if len(batch["lengths"]) != rows:
        raise InputError(f"{args.batches}: {len(batch['lengths'])} lengths for {rows} sequences")
    checks = (
        ("input_ids", lambda v: 0 <= v < args.vocab, f"outside [0, {args.vocab})"),
        ("token_type_ids", lambda v: 0 <= v < args.token_types, f"outside [0, {args.token_types})"),
        ("labels", lambda v: v == IGNORE or 0 <= v < args.vocab, f"neither {IGNORE} nor in [0, {args.vocab})"),
    )
    for field, ok, what in checks:
        bad = [v for row in batch[field] for v in row if not ok(v)]
        if bad:
            raise InputError(f"{args.batches}: {field} holds {bad[0]}, {what}")
    bad = [n for n in batch["lengths"] if not 1 <= n <= sequence]
    if bad:
        raise InputError(f"{args.batches}: a length of {bad[0]}, outside [1, {sequence}]")
    if all(label == IGNORE for row in batch["labels"] for label in row):
        raise InputError(f"{args.batches}: batch {args.batch_index} has no masked token (every label is {IGNORE})")
    return batch


def build_model(args, state, torch, transformers):
    """BertForMaskedLM of the sizes, with the state dict's weights."""
    config = transformers.BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        hidden_act="gelu_pytorch_tanh",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=args.max_positions,
        type_vocab_size=args.token_types,
        layer_norm_eps=args.layer_norm_eps,
        attn_implementation="eager",
    )
    model = transformers.BertForMaskedLM(config)
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    unexpected = [name for name in state
                  if name not in expected and name not in BUFFERS and not name.startswith(IGNORED_PREFIXES)]
    if unexpected:
        raise InputError(f"{args.weights}: tensors BertForMaskedLM does not have: {', '.join(sorted(unexpected))}")
    state = {name: tensor for name, tensor in state.items() if name in expected}
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise InputError(
                f"{args.weights}: {name} has shape {list(tensor.shape)}, the model's is {list(expected[name])}")
    for alias, name in TIED:
        if alias in state and name in state and not torch.equal(state[alias], state[name]):
            raise InputError(f"{args.weights}: {alias} differs from {name} (an untied decoder, which BERT has not)")
    missing, _ = model.load_state_dict(state, strict=False)
    names_of = {name: {name} for name in missing}
    for pair in TIED:
        for name in pair:
            names_of[name] = set(pair)
    missing = [name for name in missing if name not in BUFFERS and not names_of[name] & state.keys()]
    if missing:
        raise InputError(f"{args.weights}: missing tensors: {', '.join(sorted(missing))}")
    if model.cls.predictions.decoder.weight.data_ptr() != model.bert.embeddings.word_embeddings.weight.data_ptr():
        raise InputError("this transformers version does not tie the decoder to the word embeddings")
    return model


def run(args):
    check_sizes(args)
    batch = load_batch(args)
    if not os.path.isfile(args.weights):
        raise InputError(f"{args.weights}: no such file")
    try:
        import torch
        import transformers
        from safetensors.torch import load_file, save_file
    except ImportError as e:
        raise InputError(f"{e.name or e} is not installed: the reference needs torch, transformers and safetensors")
    if not torch.cuda.is_available():
        raise InputError("no CUDA device: the reference runs on the GPU")
    try:
        state = {name: tensor.float() if tensor.is_floating_point() else tensor
                 for name, tensor in load_file(args.weights).items()}
    except Exception as e:  # safetensors' own error types differ between versions
        raise InputError(f"{args.weights}: not a readable .safetensors file ({e})") from e

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (these are torch's defaults, said here)
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(args, state, torch, transformers).to("cuda").train()
    tensor = lambda field: torch.tensor(batch[field], dtype=torch.long, device="cuda")  # noqa: E731
    input_ids, lengths = tensor("input_ids"), tensor("lengths")
    positions = torch.arange(input_ids.shape[1], device="cuda")
    attention_mask = (positions[None, :] < lengths[:, None]).long()
    out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=tensor("token_type_ids"),
                labels=tensor("labels"))
    out.loss.backward()

    tensors = {"loss": out.loss.detach().float().reshape(1).cpu()}
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            raise InputError(f"{name} got no gradient")
        tensors[name] = parameter.grad.detach().float().contiguous().cpu()
    metadata = {"transformers": transformers.__version__, "torch": torch.__version__,
                "batches": os.path.basename(args.batches), "batch_index": str(args.batch_index)}
    try:
        save_file(tensors, args.output, metadata=metadata)
    except OSError as e:
        raise InputError(f"{args.output}: {e.strerror}") from e
    print(f"bert_reference: loss {out.loss.item():.6f}, {len(tensors) - 1} gradients written to {args.output}")


def main(argv):
    args = parse_args(argv)
    try:
        run(args)
    except InputError as e:
        print(f"bert_reference: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # torch's errors: out of memory, a CUDA failure
        print(f"bert_reference: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
