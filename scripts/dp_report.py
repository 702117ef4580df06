#!/usr/bin/env python3
"""Tables of data-parallel runs: the JSON records of fusekit-dp (cli/dp_train.cpp) and of the PyTorch
DDP peer (scripts/peers/dp_bert_ddp.py), as scripts/dp-train.sh leaves them, into one Markdown
report, one CSV and one JSON file holding every record.

    python3 scripts/dp_report.py SOURCE... --md OUT.md --csv OUT.csv --json OUT.json [--title TEXT]

A SOURCE is a directory of records, or a file this script wrote with --json (optionally .xz): each
is a batch (the runs of one call on one machine, named by the directory or by the batch names the
file holds), and runs are compared only within their batch, since timings of different machines or
calls are not comparable. Per batch, model configuration, transport and rank count, each run is set against the dense
fusekit run of the same configuration, transport and ranks (of the same step count where there is
one): the step's speedup (dense median step over the run's) and the communication
reduction (dense communication over the run's, fusekit runs only). Loss curves are compared on the
runs with the same data (echo or not), learning-rate schedule and step count: the mean loss of the
last 10 steps against dense's. Nothing is judged here that the records do not hold; a missing
dense run leaves its ratios empty.
"""
import argparse
import csv
import glob
import json
import lzma
import os
import sys


def load(source):
    """The records of one SOURCE: a directory of records, or a list written by --json (.xz too)."""
    records = []
    if os.path.isdir(source):
        batch = os.path.basename(os.path.normpath(source))
        for path in sorted(glob.glob(os.path.join(source, "*.json"))):
            try:
                with open(path) as f:
                    record = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                sys.exit(f"dp_report: cannot read {path}: {e}")
            record["_file"] = os.path.basename(path)
            record["_batch"] = batch
            records.append(record)
    else:
        try:
            opener = lzma.open if source.endswith(".xz") else open
            with opener(source, "rt") as f:
                listed = json.load(f)
        except (OSError, lzma.LZMAError, json.JSONDecodeError) as e:
            sys.exit(f"dp_report: cannot read {source}: {e}")
        if not isinstance(listed, list):
            sys.exit(f"dp_report: {source} holds no list of records (write one with --json)")
        default = os.path.basename(source).split(".")[0]
        for record in listed:
            record["_file"] = record.pop("file", "?")
            record["_batch"] = record.pop("batch", default)
            records.append(record)
    if not records:
        sys.exit(f"dp_report: no JSON records in {source}")
    return records


def transport(record):
    if record.get("transport"):
        return record["transport"]
    if record.get("model_hosts", 1) > 1:  # NVLink inside each modelled host, NCCL's network between
        return f"{record['model_hosts']} hosts, {(record.get('nccl_net') or 'default net').lower()}"
    return "socket" if record.get("nccl_p2p_disable") == "1" else "nvlink"


def name(record):
    exchange = record.get("exchange", "?")
    if exchange == "sparse":
        text = f"sparse {record.get('density'):g} {record.get('collective', '')}".strip()
        if record.get("reselect", 1) < 1:
            text += f", keep {record['reselect']:g}"
        if record.get("index_form", "plain") != "plain":
            text += f", {record['index_form']} indices"
        if record.get("frozen_variance"):
            text += f", velocity exchange with AdamW's variance frozen after {record.get('dense_steps', 0)} dense steps"
            cap = record.get("frozen_max_step")  # absent in records older than the option
            if cap is not None:
                last = record.get("frozen_max_step_last")
                text += (", step uncapped" if cap < 0 else f", step cap {cap:g} lr" if cap > 0
                         else ", step cap 1/(density x keep) lr" + (f" ({last:g})" if last and last > 0 else ""))
            if record.get("rank_by_step"):  # --rank-by-step: selected by |r| / (sqrt(v) + eps), not |r|
                text += ", ranked by step"
        elif record.get("momentum", 0) > 0:
            text += f", momentum {record['momentum']:g}"
        if record.get("dense_steps", 0) > 0 and not record.get("frozen_variance"):
            text += f", {record['dense_steps']} dense steps first"
        if record.get("warmup_steps", 0) > 0:
            text += f", density warm-up {record['warmup_steps']} steps"
        return text
    if exchange == "auto":
        return f"auto ({record.get('density'):g})"
    return exchange


def group_key(record):
    return (record["_batch"], record.get("config"), transport(record), record.get("ranks"),
            len(record.get("steps", [])), bool(record.get("echo", False)), record.get("lr_warmup", 0),
            record.get("lr"))


def final_loss(record):
    losses = [s["loss"] for s in record.get("steps", [])]
    tail = losses[-10:]
    return sum(tail) / len(tail) if tail else float("nan")


def rows_of(records):
    # Loss is compared within a group (same transport, ranks, steps, data, schedule); step times
    # against that group's dense run, else any dense fusekit run of the same transport and ranks.
    # A batch without a dense run of the group compares its losses with another batch's (the loss is
    # arithmetic, not timing); step times never leave their batch.
    dense, dense_any, dense_elsewhere, ambiguous = {}, {}, {}, set()
    for r in records:
        if r.get("exchange") == "dense":
            if group_key(r) in dense:  # e.g. runs that differ by an option the key does not hold
                print(f"dp_report: warning: two dense runs of one group in batch {r['_batch']} "
                      f"({dense[group_key(r)]['_file']}, {r['_file']}): that group's ratios are left empty; "
                      f"put such runs in batches of their own", file=sys.stderr)
                ambiguous.add(group_key(r))
            dense[group_key(r)] = r
            dense_elsewhere[group_key(r)[1:]] = r  # the last batch's, in the order the sources were given
            dense_any.setdefault((r["_batch"], r.get("config"), transport(r), r.get("ranks")), r)
    rows = []
    for r in records:
        s = r.get("summary", {})
        d = dense.get(group_key(r))
        loss_dense = d or dense_elsewhere.get(group_key(r)[1:])
        ds = (d or dense_any.get((r["_batch"], r.get("config"), transport(r), r.get("ranks")), {})).get("summary", {})
        if group_key(r) in ambiguous:
            loss_dense, ds = None, {}
        step = s.get("step_ms")
        comm = s.get("communication_ms")
        row = {
            "batch": r["_batch"],
            "transport": transport(r),
            "ranks": r.get("ranks"),
            "steps": len(r.get("steps", [])),
            "echo": bool(r.get("echo", False)),
            "lr_warmup": r.get("lr_warmup", 0),
            "lr": r.get("lr"),
            "run": name(r),
            "decision": r.get("decision", ""),
            "step_ms": step,
            "slowest_rank_step_ms": s.get("slowest_rank_step_ms"),
            "compute_ms": s.get("compute_ms"),
            "selection_ms": s.get("selection_ms"),
            "communication_ms": comm,
            "narrow_ms": s.get("narrow_ms"),
            "mb_sent_per_rank": s["bytes_per_rank_mean"] / 1e6 if "bytes_per_rank_mean" in s else None,
            "sent_max_over_mean": (s["bytes_per_rank_max"] / s["bytes_per_rank_mean"]
                                   if s.get("bytes_per_rank_mean") else None),
            "step_speedup_vs_dense": ds["step_ms"] / step if ds.get("step_ms") and step else None,
            "communication_reduction_vs_dense": (ds["communication_ms"] / comm
                                                 if ds.get("communication_ms") and comm else None),
            "final_loss": final_loss(r),
            "final_loss_vs_dense_pct": (100.0 * (final_loss(r) / final_loss(loss_dense) - 1.0) if loss_dense else None),
            "loss_dense_batch": loss_dense["_batch"] if loss_dense else None,
            "same_parameters": s.get("same_parameters"),
            "file": r["_file"],
        }
        rows.append(row)
    rows.sort(key=lambda x: (x["batch"], x["transport"], x["ranks"], x["echo"], x["lr"] or 0, x["steps"], x["run"] != "dense",
                             x["run"]))
    return rows


def fmt(v, digits=2):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(rows, records, title):
    out = [f"# {title}", ""]
    out.append("Medians over each run's steps after the first 10 (fusekit-dp's `--skip`) and after its dense steps "
               "where it has them; times from CUDA events "
               "on rank 0's stream; bytes sent per rank as nccl-tests counts bus bytes (dp/sparse_collective.h); "
               "step speedup and communication reduction are against the dense fusekit run of the same link and "
               "ranks in the same batch (the same data and steps where there is one); loss against the dense run of "
               "the same link, ranks, steps, data and schedule, in the same batch or else in the batch named after "
               "the percentage. A batch is the runs of one call on one machine.")
    out.append("")
    out.append("| batch | link | ranks | steps | data | run | step ms | compute | selection | comm | narrow "
               "| MB sent/rank | max/mean sent | step speedup | comm reduction | loss (last 10) | loss vs dense "
               "| same params |")
    out.append("|" + " --- |" * 18)
    for r in rows:
        data = ("echo" if r["echo"] else "random") + (f", lr {r['lr']:g}" if r["lr"] else "") + (
            f", warm-up {r['lr_warmup']}" if r["lr_warmup"] else "")
        out.append("| " + " | ".join([
            r["batch"], r["transport"], fmt(r["ranks"]), fmt(r["steps"]), data, r["run"], fmt(r["step_ms"]), fmt(r["compute_ms"]),
            fmt(r["selection_ms"]), fmt(r["communication_ms"]), fmt(r["narrow_ms"]), fmt(r["mb_sent_per_rank"]),
            fmt(r["sent_max_over_mean"], 3),
            (fmt(r["step_speedup_vs_dense"]) + "x") if r["step_speedup_vs_dense"] else "",
            (fmt(r["communication_reduction_vs_dense"], 1) + "x") if r["communication_reduction_vs_dense"] else "",
            fmt(r["final_loss"], 4),
            (f"{r['final_loss_vs_dense_pct']:+.2f}%" if r["final_loss_vs_dense_pct"] is not None else "") +
            (f" ({r['loss_dense_batch']})" if r["loss_dense_batch"] not in (None, r["batch"]) else ""),
            fmt(r["same_parameters"]),
        ]) + " |")
    decisions = sorted({r["decision"] for r in rows if r["decision"].startswith("auto")})
    if decisions:
        out += ["", "What `--exchange auto` chose:", ""]
        out += [f"- {d}" for d in decisions]
    curves = [r for r in records if len(r.get("steps", [])) >= 100]
    if curves:
        out += ["", "Loss, mean over ranks and over 10-step windows:", ""]
        windows = [0, 50, 100, 150, 200, 250, 290]
        out.append("| batch | link | ranks | data | run | " + " | ".join(f"steps {w}-{w + 9}" for w in windows) +
                   " |")
        out.append("|" + " --- |" * (5 + len(windows)))
        for r in sorted(curves, key=lambda x: (x["_batch"], transport(x), x.get("ranks"), bool(x.get("echo")),
                                               x.get("lr") or 0, name(x))):
            losses = [s["loss"] for s in r["steps"]]
            cells = []
            for w in windows:
                part = losses[w:w + 10]
                cells.append(f"{sum(part) / len(part):.3f}" if len(part) == 10 else "")
            data = ("echo" if r.get("echo") else "random") + (f", lr {r['lr']:g}" if r.get("lr") else "")
            out.append(f"| {r['_batch']} | {transport(r)} | {r.get('ranks')} | {data} | {name(r)} | " +
                       " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="directories of records, or files written by --json")
    parser.add_argument("--md", required=True)
    parser.add_argument("--csv", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--title", default="Data-parallel BERT training")
    args = parser.parse_args()
    records, seen = [], {}
    for source in args.sources:
        loaded = load(source)
        for batch in {r["_batch"] for r in loaded}:
            if batch in seen:
                sys.exit(f"dp_report: batch '{batch}' comes from both {seen[batch]} and {source}: rename one")
            seen[batch] = source
        records += loaded
    rows = rows_of(records)
    with open(args.md, "w") as f:
        f.write(markdown(rows, records, args.title))
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    with open(args.json, "w") as f:
        json.dump([{k: v for k, v in r.items() if not k.startswith("_")} | {"file": r["_file"], "batch": r["_batch"]}
                   for r in records], f, separators=(",", ":"))
        f.write("\n")
    print(f"dp_report: {len(records)} records -> {args.md}, {args.csv}, {args.json}")


if __name__ == "__main__":
    main()
