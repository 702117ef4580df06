"""Keeps torch.compile's Inductor from printing fusekit ops' inputs as whole IR trees.

Inductor lowers an operator it has no lowering for (every fusekit op) as an implicit fallback, and
before it does, it logs the call with `OperatorIssue.operator_str(target, args, kwargs)` (graph.py's
call_function). The string is built before the logger looks at its level, and it formats each input
IR node with its inputs, recursively and without memoization: a fusekit op's input is the output of
another fusekit op, whose inputs are the outputs of others, and every shared node is printed once per
path to it. For a patched 12-layer BERT that took longer than 350 s on the H100 while a 2-layer one
compiled in 21 s (PyTorch issue 139501 shows the same recursion; later PyTorch formats the line
lazily). `bound_fallback_log` makes that string name a fusekit op and its argument count only;
other operators keep PyTorch's text. It changes a log line, nothing that is compiled.
"""


def _is_fusekit(target):
    name = getattr(target, "name", None)
    try:
        qualified = name() if callable(name) else (name or str(target))
    except Exception:  # an object that cannot name itself is not ours
        return False
    return str(qualified).startswith("fusekit::") or str(qualified).startswith("fusekit.")


def bound_fallback_log(exc_module):
    """Replaces exc_module.OperatorIssue.operator_str (torch._inductor.exc) for fusekit's ops; once.
    Returns whether it is in place (False where this PyTorch has no such method)."""
    issue = getattr(exc_module, "OperatorIssue", None)
    original = getattr(issue, "operator_str", None) if issue is not None else None
    if original is None:
        return False
    if getattr(original, "fusekit_bounded", False):
        return True

    def operator_str(target, args, kwargs):
        if _is_fusekit(target):
            return (f"target: {target} ({len(args)} positional and {len(kwargs or {})} keyword arguments; "
                    "not printed for fusekit's ops, see fusekit.inductor)")
        return original(target, args, kwargs)

    operator_str.fusekit_bounded = True
    issue.operator_str = staticmethod(operator_str)
    return True
