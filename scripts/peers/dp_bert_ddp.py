"""The PyTorch peer of fusekit-dp (cli/dp_train.cpp): data-parallel BERT masked-LM training with
torch DistributedDataParallel, one process per GPU, on the same batches, schedule and record.

  torchrun --standalone --nproc-per-node=4 scripts/peers/dp_bert_ddp.py --hook powersgd --json out/ddp.json

Model, optimizer and AMP are scripts/peers/ops/bert_step.py's (make_model, make_optimizer): Hugging
Face BertForMaskedLM of the preset (bert-base: 12 x 768, 12 heads, FFN 3072, vocab 30522,
"gelu_pytorch_tanh", dropout 0.1), fp32 parameters, SDPA attention (checked: any other
implementation is an error), weights from --seed by Hugging Face's initializer (another generator
than models/bert_init.h; DDP copies rank 0's to every rank when it wraps the model), then the
dropout generator seeded per rank (seed * 1000003 + rank, as fusekit-dp). Fused AdamW, lr --lr,
betas (0.9, 0.999), eps 1e-6, weight decay 0.01 but on biases and LayerNorm parameters; fp16
autocast; GradScaler(init_scale=1024, growth_interval=10**9): fusekit's static scale of 1024 that
never grows (it still halves and skips the step on non-finite gradients; such steps are counted).

Gradient exchange (--hook), DDP's bucketed allreduce overlapped with the backward:
  none      plain DDP: fp32 buckets, averaged; the default a user gets
  fp16      default_hooks.fp16_compress_hook: the buckets cast to fp16 for the allreduce, the
            dense fp16 baseline (fusekit's dense exchange is an fp16 allreduce too)
  powersgd  powerSGD_hook with PowerSGDState(matrix_approximation_rank --powersgd-rank, 4 by
            default; start_powerSGD_iter 10, error feedback and warm start on): plain allreduce for
            the first 10 steps, then rank-r factors of every matrix-shaped gradient
DDP averages the gradients over the ranks where fusekit sums them; AdamW is invariant to that
factor but for its eps.

Data as fusekit-dp: rank r's pool is batches r * pool .. r * pool + pool - 1 of
mlm_data.make_mlm_batch(batch, seq, index, seed=--seed), made on the GPU before the first step; step
s trains on pool entry s % pool. Each step sits between two CUDA events on the current stream
(zero_grad, forward, backward with DDP's communication, the optimizer step and the scaler's update),
then the host synchronizes and reads the loss: host time inside the step counts, as in fusekit-dp.

Rank 0 prints a line every --print-every steps (its own loss) and the summary: the median step time
over steps --skip .. steps - 1 (rank 0's and the slowest rank's), the loss of the last 10 steps
averaged over the ranks, whether every rank ends with bitwise the same parameters; --json writes
the record with cli/dp_train.cpp's keys where they apply (non-finite numbers as null). Exit codes:
0 done, 1 a failure (also: a step with non-finite gradients or loss, or parameters that differ
between ranks), 2 a usage error.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/peers: mlm_data, ops

from mlm_data import make_mlm_batch  # noqa: E402 (after the path is set)

# PyTorch is imported here but needed only after the options are parsed, so --help works without it.
try:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    from ops import bert_step
except ImportError as e:
    torch = None
    IMPORT_ERROR = e

NAME = "dp_bert_ddp"
HOOKS = ("none", "fp16", "powersgd")
POWERSGD_START_ITER = 10
FINAL_LOSS_STEPS = 10  # cli/dp_train.cpp: the summary's loss is the mean of the last 10 steps


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse's default prints the usage too)
        print(f"{NAME}: {message}", file=sys.stderr)
        sys.exit(2)


def at_least(low, kind=int):
    def parse(text):
        value = kind(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is less than {low}")
        return value
    return parse


def parse_args():
    parser = Parser(description="The PyTorch peer of fusekit-dp: data-parallel BERT masked-LM training with DDP.")
    parser.add_argument("--hook", choices=HOOKS, default="none", help="DDP's gradient exchange")
    parser.add_argument("--model", default="bert-base", choices=("bert-base", "bert-large", "bert-tiny"))
    parser.add_argument("--batch", type=at_least(1), default=64, help="sequences per rank and step")
    parser.add_argument("--seq", type=at_least(3), default=128, help="sequence length (at most 512)")
    parser.add_argument("--steps", type=at_least(1), default=300)
    parser.add_argument("--pool", type=at_least(1), default=32, help="batches per rank, cycled")
    parser.add_argument("--skip", type=at_least(0), default=10, help="steps the summary's medians leave out")
    parser.add_argument("--lr", type=at_least(0.0, float), default=1e-4, help="AdamW learning rate")
    parser.add_argument("--seed", type=at_least(0), default=1, help="weights, data and dropout seed")
    parser.add_argument("--powersgd-rank", type=at_least(1), default=4, help="powersgd: matrix_approximation_rank")
    parser.add_argument("--print-every", type=at_least(0), default=25,
                        help="rank 0 prints every this many steps (0: never)")
    parser.add_argument("--json", help="rank 0 writes the record here")
    parser.add_argument("--label", default="", help="label written into the record")
    args = parser.parse_args()
    if args.seq > 512:
        parser.error(f"--seq {args.seq} is more than the 512 positions")
    return args


def one_line(error) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def finite_or_none(value, digits):
    return round(value, digits) if math.isfinite(value) else None


def pool_batches(args, rank):
    """This rank's pool as (input_ids, token_type_ids, attention_mask, labels), int64 on the GPU:
    bert_step.device_batches' tensors for fusekit-dp's batch indices and seed."""
    positions = torch.arange(args.seq)
    out = []
    for i in range(args.pool):
        raw = make_mlm_batch(args.batch, args.seq, rank * args.pool + i, seed=args.seed, vocab=bert_step.VOCAB)
        lengths = torch.tensor(raw["lengths"], dtype=torch.long)
        attention_mask = (positions[None, :] < lengths[:, None]).long()
        ids, types, labels = (torch.tensor(raw[k], dtype=torch.long) for k in ("input_ids", "token_type_ids", "labels"))
        out.append(tuple(t.to("cuda") for t in (ids, types, attention_mask, labels)))
    return out


def wrap(model, hook, local_rank, powersgd_rank):
    """The model in DDP with the --hook's communication hook."""
    ddp = DistributedDataParallel(model, device_ids=[local_rank])
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True,
                                            warm_start=True)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


def mismatched_bytes_against_rank0(model) -> int:
    """Bytes of the parameters that differ from rank 0's, summed over the ranks (0: all the same)."""
    count = torch.zeros((), dtype=torch.long, device="cuda")
    for p in model.parameters():
        mine = p.detach().contiguous()
        theirs = mine.clone()
        dist.broadcast(theirs, src=0)
        count += (theirs.view(torch.uint8) != mine.view(torch.uint8)).sum()
    dist.all_reduce(count)
    return int(count.item())


def run(args) -> int:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if key not in os.environ:
            raise UsageError(f"{key} is unset: start it with torchrun --nproc-per-node=N")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    if args.json and os.environ["RANK"] == "0":
        open(args.json, "w", encoding="utf-8").close()  # fails now, not after the steps; leaves no stale record
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    status = train(args, local_rank)  # its model, DDP wrapper and hook state are freed on its return
    # A barrier (rank 0 has written the record): no rank tears its communicator down while another uses it.
    dist.all_reduce(torch.zeros(1, device="cuda"))
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return status


def train(args, local_rank) -> int:
    """The steps, the summary and the record; the exit status."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    spec = f"{args.model}:b{args.batch}:s{args.seq}:fp16"
    exchange = f"ddp-{args.hook}"

    batches = pool_batches(args, rank)
    bert_step.WEIGHT_SEED = args.seed  # make_model seeds the initializer with it
    model = bert_step.make_model(args.model)
    attention = getattr(model.config, "_attn_implementation", None)
    if attention != "sdpa":
        raise RuntimeError(f"transformers chose attention implementation '{attention}', not 'sdpa'")
    torch.manual_seed(args.seed * 1000003 + rank)  # each rank its own dropout masks
    optimizer = bert_step.make_optimizer(model)
    for group in optimizer.param_groups:
        group["lr"] = args.lr
    scaler = torch.amp.GradScaler("cuda", init_scale=bert_step.FP16_LOSS_SCALE, growth_interval=10**9)
    ddp = wrap(model, args.hook, local_rank, args.powersgd_rank)
    elements = sum(p.numel() for p in model.parameters())

    transformers_version = sys.modules["transformers"].__version__  # imported by make_model
    if rank == 0:
        print(f"ddp-peer: {ranks} ranks, {spec}, {elements / 1e6:.1f}M gradients ({elements * 4 / 1e6:.0f} MB fp32), "
              f"exchange {exchange}, attention {attention}, torch {torch.__version__}, transformers "
              f"{transformers_version}, NCCL_P2P_DISABLE={os.environ.get('NCCL_P2P_DISABLE', 'unset')} "
              f"NCCL_SHM_DISABLE={os.environ.get('NCCL_SHM_DISABLE', 'unset')}", flush=True)

    nvtx = torch.cuda.nvtx  # bert_step's ranges: bert.step > bert.forward / bert.backward / bert.optimizer

    def step(s):
        input_ids, token_type_ids, attention_mask, labels = batches[s % args.pool]
        nvtx.range_push("bert.step")
        optimizer.zero_grad(set_to_none=True)
        nvtx.range_push("bert.forward")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = ddp(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                       labels=labels).loss
        nvtx.range_pop()
        nvtx.range_push("bert.backward")
        scaler.scale(loss).backward()  # DDP's allreduce buckets (and the hook) run inside
        nvtx.range_pop()
        nvtx.range_push("bert.optimizer")
        scaler.step(optimizer)
        scaler.update()
        nvtx.range_pop()
        nvtx.range_pop()
        return loss

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    losses, step_ms = [], []
    skipped_steps = 0  # the scaler found non-finite gradients: it skipped the step and halved the scale
    scale = scaler.get_scale()
    wall_start = time.perf_counter()
    for s in range(args.steps):
        begin.record()
        loss = step(s)
        end.record()
        end.synchronize()
        step_ms.append(begin.elapsed_time(end))
        losses.append(loss.item())
        new_scale = scaler.get_scale()
        if new_scale < scale:
            skipped_steps += 1
        scale = new_scale
        if rank == 0 and args.print_every > 0 and (s % args.print_every == 0 or s + 1 == args.steps):
            print(f"step {s:4d}  loss {losses[-1]:.4f}  step {step_ms[-1]:.2f} ms  loss scale {scale:g}", flush=True)
    wall_s = time.perf_counter() - wall_start

    # Every step's loss averaged over the ranks (one allreduce); every rank's median and counts.
    summed = torch.tensor(losses, dtype=torch.float64, device="cuda")
    dist.all_reduce(summed)
    mean_losses = (summed / ranks).tolist()
    first = min(args.skip, args.steps - 1)
    median_ms = statistics.median(step_ms[first:])
    nonfinite_losses = sum(1 for value in losses if not math.isfinite(value))
    mine = torch.tensor([median_ms, skipped_steps, nonfinite_losses], dtype=torch.float64, device="cuda")
    gathered = [torch.zeros_like(mine) for _ in range(ranks)]
    dist.all_gather(gathered, mine)
    every_rank = torch.stack(gathered).cpu()
    slowest_ms = float(every_rank[:, 0].max())
    nonfinite_rank_steps = int(every_rank[:, 1].sum())
    nonfinite_rank_losses = int(every_rank[:, 2].sum())
    same_parameters = mismatched_bytes_against_rank0(model) == 0

    if rank == 0:
        window = min(FINAL_LOSS_STEPS, len(mean_losses))
        final_loss = sum(mean_losses[-window:]) / window
        print(f"ddp-peer summary: {ranks} ranks, {spec}, {exchange}; medians over steps {first}..{args.steps - 1}: "
              f"step {median_ms:.3f} ms (slowest rank {slowest_ms:.3f}); loss of the last {window} steps "
              f"{final_loss:.4f}; {wall_s:.1f} s", flush=True)
        print(f"ddp-peer: parameters after the last step {'are bitwise the same' if same_parameters else 'DIFFER'} "
              "on every rank", flush=True)
        if nonfinite_rank_steps > 0:
            print(f"ddp-peer: {nonfinite_rank_steps} rank-steps had non-finite gradients (the scaler skipped them)",
                  flush=True)
        if nonfinite_rank_losses > 0:
            print(f"ddp-peer: {nonfinite_rank_losses} rank-steps had a non-finite loss", flush=True)
        if args.json:
            record = {
                "label": args.label, "ranks": ranks, "config": spec, "exchange": exchange,
                "peer": "torch DDP", "torch": torch.__version__, "transformers": transformers_version,
                "attention": attention,
                "powersgd_rank": args.powersgd_rank if args.hook == "powersgd" else None,
                "lr": args.lr, "pool": args.pool, "seed": args.seed,
                "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE", ""),
                "nccl_shm_disable": os.environ.get("NCCL_SHM_DISABLE", ""),
                "gradient_elements": elements, "skip": args.skip,
                "summary": {"step_ms": round(median_ms, 4), "slowest_rank_step_ms": round(slowest_ms, 4),
                            "final_loss": finite_or_none(final_loss, 5), "nonfinite_rank_steps": nonfinite_rank_steps,
                            "nonfinite_rank_losses": nonfinite_rank_losses, "same_parameters": same_parameters,
                            "wall_s": round(wall_s, 2)},
                "steps": [{"loss": finite_or_none(loss, 5), "step_ms": round(ms, 4)}
                          for loss, ms in zip(mean_losses, step_ms)],
            }
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2, allow_nan=False)
                f.write("\n")
    return 1 if nonfinite_rank_steps or nonfinite_rank_losses or not same_parameters else 0


def main() -> int:
    args = parse_args()
    if torch is None:
        print(f"{NAME}: needs PyTorch ({one_line(IMPORT_ERROR)})", file=sys.stderr)
        return 1
    try:
        return run(args)
    except UsageError as e:
        print(f"{NAME}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # one line a rank; torchrun stops the other ranks
        print(f"{NAME}: rank {os.environ.get('RANK', '?')}: {one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
