"""fusekit.torch.AdamW: torch.optim.AdamW's update (decoupled weight decay) over fusekit's AdamW
kernel (kernels/adamw.h): a group's float32 parameters that share a step count in one launch,
whatever their sizes and alignments. Use it in place of torch.optim.AdamW (the same update and
defaults; lr, betas, eps and weight_decay only: amsgrad, maximize, foreach, capturable and fused
are not taken; its state keeps step as an int, torch's as a tensor), with torch.amp.GradScaler as usual (the scaler
unscales the gradients and skips the step on non-finite ones before calling step()). Parameters
must be float32 CUDA tensors (mixed precision keeps its master weights in float32 under autocast);
16-bit parameters raise a TypeError that says so.
"""

import torch

from fusekit import ops


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        if not lr >= 0:
            raise ValueError(f"fusekit.torch.AdamW: lr must be >= 0, not {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"fusekit.torch.AdamW: betas must be in [0, 1), not {betas}")
        if not eps >= 0:
            raise ValueError(f"fusekit.torch.AdamW: eps must be >= 0, not {eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # One launch per step count (parameters that missed a step because they had no gradient
            # count their own steps, as torch.optim.AdamW does).
            by_step = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32 or p.grad.dtype != torch.float32 or not p.is_cuda:
                    raise TypeError(f"fusekit.torch.AdamW: parameters must be float32 CUDA tensors, not {p.dtype} on "
                                    f"{p.device} (keep float32 master weights and train under autocast)")
                if p.grad.is_sparse:
                    raise TypeError("fusekit.torch.AdamW: sparse gradients are not supported")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                lists = by_step.setdefault(state["step"], ([], [], [], []))
                lists[0].append(p)
                lists[1].append(p.grad.contiguous())
                lists[2].append(state["exp_avg"])
                lists[3].append(state["exp_avg_sq"])
            beta1, beta2 = group["betas"]
            for step, (params, grads, exp_avgs, exp_avg_sqs) in by_step.items():
                if any(not p.is_contiguous() for p in params):
                    raise ValueError("fusekit.torch.AdamW: parameters must be contiguous")
                ops.adamw_step_(params, grads, exp_avgs, exp_avg_sqs, group["lr"], beta1, beta2, group["eps"],
                                group["weight_decay"], step)
        return loss
