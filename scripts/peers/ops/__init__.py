"""One module per operator (as suites/ops/<op>.cpp), named as the operator. Each defines
make_case(case) -> common.PeerCase: from a listed case (cases.ListedCase: name, op, shape, dtype,
backward, bytes, flops) its input maker and the eager function that torch.compile wraps. The cases,
their names, shapes and bytes come from fusekit's listing; cases.py, common.py and swin_window.py are not operators."""
