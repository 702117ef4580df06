"""timm's SwinTransformer, one forward and backward in float32 and one under AMP: the reference of
fusekit's fused Swin step (models/swin_fused.h; tests/gpu/swin_model_test.cpp).

Builds timm.models.swin_transformer.SwinTransformer of the given sizes (drop_path_rate 0, no
dropout), loads a state dict (.safetensors, timm's names, as models/swin_checkpoint.h writes it),
runs the images and labels of --batch (.safetensors: "images" F32 [B, C, H, W], "labels" I64 [B])
through it with cross-entropy (label smoothing --label-smoothing, ignore_index -100), and writes to
--output the loss ("fp32.loss", F32 [1]) and every parameter's gradient ("fp32.<name>", F32), then
the same under torch.autocast(--dtype) with the loss scaled by 1024 and the gradients divided back
("amp.loss", "amp.<name>"): the test's tolerance is twice AMP's own error against float32. Also
which parameters timm's optimizer factory decays ("decay.<name>", F32 [1]: 1 or 0), from the
parameter groups of timm.optim.create_optimizer_v2(model, "adamw", weight_decay=0.05).

Bad input is one line on stderr and exit status 1; usage errors exit with 2.
"""
import argparse
import os
import sys


class InputError(Exception):
    pass


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"swin_reference: {message} (--help for usage)", file=sys.stderr)
        sys.exit(2)


def ints(text):
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None


def parse_args(argv):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--image", type=int, required=True)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--embed-dim", type=int, required=True)
    parser.add_argument("--depths", type=ints, required=True)
    parser.add_argument("--heads", type=ints, required=True)
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--output", required=True)
    return parser.parse_args(argv)


def run(args):
    for path in (args.weights, args.batch):
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such file")
    try:
        import torch
        import torch.nn.functional as F
        from safetensors.torch import load_file, save_file
        from timm.models.swin_transformer import SwinTransformer
    except ImportError as e:
        raise InputError(f"{e.name or e} is not installed: the reference needs torch, timm and safetensors") from None
    if not torch.cuda.is_available():
        raise InputError("no CUDA device: the reference runs on the GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    state = {k: v.float() for k, v in load_file(args.weights).items()}
    batch = load_file(args.batch)
    images, labels = batch["images"].float().cuda(), batch["labels"].long().cuda()
    model = SwinTransformer(img_size=args.image, patch_size=args.patch, window_size=args.window,
                            embed_dim=args.embed_dim, depths=args.depths, num_heads=args.heads,
                            num_classes=args.classes, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "relative_position_index" not in m and "attn_mask" not in m]
    if missing or unexpected:
        raise InputError(f"{args.weights}: missing {missing}, unexpected {unexpected}")
    model = model.cuda().train()
    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    tensors = {}
    try:
        from timm.optim import create_optimizer_v2
    except ImportError as e:
        raise InputError(f"timm.optim has no create_optimizer_v2 ({e})") from None
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    decaying = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
    for name, p in model.named_parameters():
        tensors[f"decay.{name}"] = torch.tensor([1.0 if id(p) in decaying else 0.0])
    for prefix, dtype, scale in (("fp32", None, 1.0), ("amp", amp, 1024.0)):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=args.label_smoothing, ignore_index=-100)
        (loss * scale).backward()
        tensors[f"{prefix}.loss"] = loss.detach().float().reshape(1).cpu()
        for name, p in model.named_parameters():
            if p.grad is None:
                raise InputError(f"{name} got no gradient")
            tensors[f"{prefix}.{name}"] = (p.grad.detach().float() / scale).contiguous().cpu()
    try:
        save_file(tensors, args.output, metadata={"torch": torch.__version__})
    except OSError as e:
        raise InputError(f"{args.output}: {e.strerror}") from e
    print(f"swin_reference: fp32 loss {tensors['fp32.loss'].item():.6f}, amp loss {tensors['amp.loss'].item():.6f}")


def main(argv):
    args = parse_args(argv)
    try:
        run(args)
    except InputError as e:
        print(f"swin_reference: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
