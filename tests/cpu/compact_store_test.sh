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
# An uncorrelated runtime record (as cudaEventRecord leaves) and a temporary store path.
python3 - "$work/a.db" <<'PY' || exit 1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
run, start = db.execute("SELECT runId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()
db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME(runId, start, end, correlationId) VALUES (?, ?, ?, 987654)",
           (run, start, start + 10))
db.commit()
PY
# A copy whose command line names a temporary store path.
cp "$work/a.db" "$work/c.db"
python3 -c "import sqlite3,sys; db = sqlite3.connect(sys.argv[1]); db.execute(sys.argv[2]); db.commit()" "$work/c.db" \
  "UPDATE runs SET commandLine = 'fusekit bench --suite ops --db /tmp/tmp.x1/fusekit.db --reps 30'"
count() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])" "$@"; }
runtime_before=$(count "$work/a.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")

python3 "$COMPACT" "$work/a.db" "$work/a.db.xz" >"$work/out.txt" 2>&1 || fail "compact_store exit $?: $(cat "$work/out.txt")"
xz -dc "$work/a.db.xz" >"$work/b.db" || fail "the output is not xz"
runtime_after=$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
[ "$runtime_after" = $((runtime_before - 1)) ] || fail "runtime records: $runtime_before -> $runtime_after, want one fewer"
[ "$(count "$work/b.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = 987654")" = 0 ] ||
  fail "the uncorrelated record stayed"
python3 "$COMPACT" "$work/c.db" "$work/c.db.xz" >/dev/null 2>&1 || fail "compact_store of c.db"
xz -dc "$work/c.db.xz" >"$work/d.db" || fail "the output is not xz"
[ "$(count "$work/d.db" "SELECT commandLine FROM runs")" = "fusekit bench --suite ops --db out/fusekit.db --reps 30" ] ||
  fail "command line: $(count "$work/d.db" "SELECT commandLine FROM runs")"
[ "$(count "$work/a.db" "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")" = "$runtime_before" ] ||
  fail "the input store was modified"
# The case tables are unchanged; the run header counts the API records left (one fewer), nothing else moves.
for format in csv md json; do
  "$FUSEKIT" report --db "$work/a.db" --format $format -o "$work/a.$format" >/dev/null 2>&1 || fail "report $format of a.db"
  "$FUSEKIT" report --db "$work/b.db" --format $format -o "$work/b.$format" >/dev/null 2>&1 || fail "report $format of b.db"
done
cmp -s "$work/a.csv" "$work/b.csv" || fail "the csv report changed"
diff <(grep -v "API calls" "$work/a.md") <(grep -v "API calls" "$work/b.md") >/dev/null || fail "the md report changed"
grep -q " 7 API calls" "$work/a.md" && grep -q " 6 API calls" "$work/b.md" || fail "md API calls: want 7 -> 6"
diff <(tr ',' '\n' <"$work/a.json" | grep -v api_calls) <(tr ',' '\n' <"$work/b.json" | grep -v api_calls) >/dev/null ||
  fail "the json report changed"
"$FUSEKIT" summary --db "$work/a.db" >"$work/a.summary"
"$FUSEKIT" summary --db "$work/b.db" >"$work/b.summary"
cmp -s "$work/a.summary" "$work/b.summary" || fail "the summary changed"

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

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "compact_store: all checks passed"
