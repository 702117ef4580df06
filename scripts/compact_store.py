#!/usr/bin/env python3
"""Compacts a fusekit store for shipping as evidence (evidence/<gpu>/*.db.xz).

Deletes the CUDA runtime API records that correlate with no kernel, copy or memset of their run
(the launches' own records stay; cudaEventRecord, cudaStreamSynchronize and the like go: most of a
suite store's bytes, read by no report), rewrites the store path in the recorded command lines
(`--db <temporary path>` -> `--db out/fusekit.db`, as scripts/run.sh names it), vacuums, and
writes the result xz-compressed. The kernels, copies, memsets, NVTX ranges, cases and samples are
left as they were: `fusekit report` and `fusekit summary` of the compacted store print the same
case tables and kernel shares as of the original; only the run header's count of API calls (and
its wall span, where the first or last record was such a call) counts what is left.

  scripts/compact_store.py STORE OUTPUT.db.xz [--db-path out/fusekit.db]
"""
import argparse
import lzma
import os
import re
import shutil
import sqlite3
import sys
import tempfile

RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
CORRELATED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def fail(message):
    print(f"compact_store: {message}", file=sys.stderr)
    sys.exit(1)


def rewrite_store_path(command, path):
    """The command line with fusekit's own `--db X` / `--db=X` (the first one, before a ` -- ` that
    starts a traced program's arguments) naming `path`; anything after ` -- ` is left alone."""
    head, separator, tail = command.partition(" -- ")
    head = re.sub(r"(^|\s)(--db[ =])(\S+)", lambda m: m.group(1) + m.group(2) + path, head, count=1)
    return head + separator + tail


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="the fusekit store (SQLite) to compact; it is not modified")
    parser.add_argument("output", help="where the compacted store goes, xz-compressed (for example ops.db.xz)")
    parser.add_argument("--db-path", default="out/fusekit.db",
                        help="the store path the recorded command lines get (default: out/fusekit.db)")
    args = parser.parse_args()
    if not os.path.isfile(args.store):
        fail(f"no such store: {args.store}")
    output_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(output_dir):
        fail(f"no such folder for the output: {output_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "store.db")
        # SQLite's online backup, not a file copy: a store written in WAL mode keeps committed rows in
        # its -wal file until a checkpoint, and a copy of the main file alone would drop them.
        try:
            source = sqlite3.connect(f"file:{args.store}?mode=ro", uri=True)
            db = sqlite3.connect(copy)
            source.backup(db)
            source.close()
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            fail(f"{args.store} is not a SQLite store: {e}")
        missing = [t for t in ("runs", RUNTIME) + CORRELATED if t not in tables]
        if missing:
            fail(f"{args.store} is not a fusekit store (no table {', '.join(missing)})")
        before = db.execute(f"SELECT count(*) FROM {RUNTIME}").fetchone()[0]
        db.execute("CREATE TEMP TABLE correlated(runId INTEGER, correlationId INTEGER, "
                   "PRIMARY KEY(runId, correlationId)) WITHOUT ROWID")
        for table in CORRELATED:
            db.execute(f"INSERT OR IGNORE INTO correlated SELECT runId, correlationId FROM {table}")
        db.execute(f"DELETE FROM {RUNTIME} WHERE NOT EXISTS (SELECT 1 FROM correlated c WHERE "
                   f"c.runId = {RUNTIME}.runId AND c.correlationId = {RUNTIME}.correlationId)")
        after = db.execute(f"SELECT count(*) FROM {RUNTIME}").fetchone()[0]
        for run_id, command in db.execute("SELECT id, commandLine FROM runs").fetchall():
            if command:
                db.execute("UPDATE runs SET commandLine = ? WHERE id = ?",
                           (rewrite_store_path(command, args.db_path), run_id))
        db.commit()
        db.execute("VACUUM")
        db.close()
        # Written beside the output and renamed over it: a failed write leaves no partial file.
        partial = os.path.join(output_dir, f".{os.path.basename(args.output)}.partial")
        try:
            with open(copy, "rb") as source_file, lzma.open(partial, "wb", preset=9) as target:
                shutil.copyfileobj(source_file, target)
            os.replace(partial, args.output)
        except OSError as e:
            if os.path.exists(partial):
                os.remove(partial)
            fail(f"cannot write {args.output}: {e.strerror}")
    print(f"compact_store: removed {before - after} of {before} runtime API records (no kernel, copy or memset); "
          f"wrote {args.output} ({os.path.getsize(args.output)} bytes)")


if __name__ == "__main__":
    main()
