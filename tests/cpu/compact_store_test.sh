#!/usr/bin/env bash
# scripts/compact_store.py on a synthetic store: runtime API records without a kernel, copy or
# memset go, the correlated ones stay, the command line's store path is rewritten, the reports'
# case tables and the summary are unchanged (the run header's API call count drops); bad input is
# one error line and a non-zero exit.
set -u
FUSEKIT="$1"
MAKE_STORE="$2"
COMPACT="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

"$MAKE_STORE" "$work/a.db" 1000 500 1 || exit 1
"$MAKE_STORE" "$work/a.db" 1000 600 2 || exit 1  # a second run: its correlation ids repeat the first's
# An uncorrelated runtime record (as cudaEventRecord leaves). And a record whose correlation id has a
# kernel in run 1 but not in its own run 2: it goes too (correlation is per run).
python3 - "$work/a.db" <<'PY' || exit 1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
run, start = db.execute("SELECT runId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE runId = 1 LIMIT 1").fetchone()
db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME(runId, start, end, correlationId) VALUES (?, ?, ?, 987654)",
           (run, start, start + 10))
assert db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = 1 AND correlationId = 3").fetchone()[0]
db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = 2 AND correlationId = 3")
db.commit()
PY
# A copy whose command line names a temporary store path.
cp "$work/a.db" "$work/c.db"
python3 -c "import sqlite3,sys; db = sqlite3.connect(sys.argv[1]); db.execute(sys.argv[2]); db.commit()" "$work/c.db" \
  "UPDATE runs SET commandLine = CASE id WHEN 1 THEN 'fusekit bench --suite ops --db /tmp/tmp.x1/fusekit.db --reps 30'
     ELSE 'fusekit trace --db=/tmp/tmp.x2/t.db --label \"a --db b\" -- python3 p.py --db other.db' END"
count() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])" "$@"; }
runtime_before=$(count "$work/a.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")

python3 "$COMPACT" "$work/a.db" "$work/a.db.xz" >"$work/out.txt" 2>&1 || fail "compact_store exit $?: $(cat "$work/out.txt")"
xz -dc "$work/a.db.xz" >"$work/b.db" || fail "the output is not xz"
runtime_after=$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
[ "$runtime_after" = $((runtime_before - 2)) ] || fail "runtime records: $runtime_before -> $runtime_after, want two fewer"
[ "$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = 987654")" = 0 ] ||
  fail "the uncorrelated record stayed"
[ "$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE runId = 2 AND correlationId = 3")" = 0 ] ||
  fail "a record correlated only in another run stayed"
[ "$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE runId = 1 AND correlationId = 3")" = 1 ] ||
  fail "a correlated record went"
python3 "$COMPACT" "$work/c.db" "$work/c.db.xz" >/dev/null 2>&1 || fail "compact_store of c.db"
xz -dc "$work/c.db.xz" >"$work/d.db" || fail "the output is not xz"
[ "$(count "$work/d.db" "SELECT commandLine FROM runs WHERE id = 1")" = "fusekit bench --suite ops --db out/fusekit.db --reps 30" ] ||
  fail "command line: $(count "$work/d.db" "SELECT commandLine FROM runs WHERE id = 1")"
[ "$(count "$work/d.db" "SELECT commandLine FROM runs WHERE id = 2")" = \
  'fusekit trace --db=out/fusekit.db --label "a --db b" -- python3 p.py --db other.db' ] ||
  fail "command line: $(count "$work/d.db" "SELECT commandLine FROM runs WHERE id = 2")"
[ "$(count "$work/a.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")" = "$runtime_before" ] ||
  fail "the input store was modified"
# The case tables are unchanged; the run header counts the API records left (one fewer), nothing else moves.
for format in csv md json; do
  "$FUSEKIT" report --db "$work/a.db" --format $format -o "$work/a.$format" >/dev/null 2>&1 || fail "report $format of a.db"
  "$FUSEKIT" report --db "$work/b.db" --format $format -o "$work/b.$format" >/dev/null 2>&1 || fail "report $format of b.db"
done
cmp -s "$work/a.csv" "$work/b.csv" || fail "the csv report changed"
diff <(grep -v "API calls" "$work/a.md") <(grep -v "API calls" "$work/b.md") >/dev/null || fail "the md report changed"
# The report shows the latest run (2), which lost one record.
api_a=$(grep -o "[0-9]* API calls" "$work/a.md" | cut -d' ' -f1)
api_b=$(grep -o "[0-9]* API calls" "$work/b.md" | cut -d' ' -f1)
[ -n "$api_a" ] && [ "$api_b" = $((api_a - 1)) ] || fail "md API calls: $api_a -> $api_b, want one fewer"
diff <(tr ',' '\n' <"$work/a.json" | grep -v api_calls) <(tr ',' '\n' <"$work/b.json" | grep -v api_calls) >/dev/null ||
  fail "the json report changed"
for run in 1 2; do
  "$FUSEKIT" summary --db "$work/a.db" --run $run >"$work/a.summary" || fail "summary of a.db run $run"
  "$FUSEKIT" summary --db "$work/b.db" --run $run >"$work/b.summary" || fail "summary of b.db run $run"
  grep -q "scale_kernel" "$work/a.summary" || fail "the summary of run $run lists no kernel"
  cmp -s "$work/a.summary" "$work/b.summary" || fail "the summary of run $run changed"
done

# A store still open in WAL mode: rows committed but not yet checkpointed into the main file are kept.
python3 - "$work/a.db" "$COMPACT" "$work/w.db.xz" <<'PY' || fail "WAL: $(cat "$work/wal.err" 2>/dev/null)"
import lzma, sqlite3, subprocess, sys, tempfile
store, compact, out = sys.argv[1:4]
db = sqlite3.connect(store)
db.execute("PRAGMA wal_autocheckpoint = 0")
db.execute("UPDATE runs SET label = 'written after the last checkpoint' WHERE id = 1")
db.commit()  # in the -wal file; the connection stays open, so nothing checkpoints it
subprocess.run([sys.executable, compact, store, out], check=True, capture_output=True)
with tempfile.NamedTemporaryFile(suffix=".db") as f:
    f.write(lzma.open(out).read())
    f.flush()
    label = sqlite3.connect(f.name).execute("SELECT label FROM runs WHERE id = 1").fetchone()[0]
sys.exit(0 if label == "written after the last checkpoint" else f"label {label!r}")
PY

# Bad input: one line on stderr, exit 1, no output file.
echo "not a database" >"$work/bad.db"
for input in "$work/missing.db" "$work/bad.db"; do
  python3 "$COMPACT" "$input" "$work/bad.db.xz" >"$work/bad.out" 2>"$work/bad.err"
  code=$?
  [ "$code" = 1 ] || fail "$(basename "$input"): exit $code, want 1"
  [ "$(wc -l <"$work/bad.err")" = 1 ] || fail "$(basename "$input"): stderr is not one line: $(cat "$work/bad.err")"
  [ -e "$work/bad.db.xz" ] && fail "$(basename "$input"): an output was written"
done
python3 - "$work/plain.db" <<'PY'
import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute("CREATE TABLE t(x)")
PY
python3 "$COMPACT" "$work/plain.db" "$work/bad.db.xz" 2>"$work/bad.err" && fail "a non-fusekit store was accepted"
grep -q "not a fusekit store" "$work/bad.err" || fail "non-fusekit store: $(cat "$work/bad.err")"
python3 "$COMPACT" "$work/a.db" "$work/no/such/folder/x.db.xz" 2>"$work/bad.err" && fail "a missing output folder was accepted"
[ "$(wc -l <"$work/bad.err")" = 1 ] || fail "missing output folder: stderr is not one line: $(cat "$work/bad.err")"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "compact_store: all checks passed"
