#!/usr/bin/env bash
# The CLI on bad input: each case must exit with the expected code and say one clear line, and
# must leave a foreign file untouched. Runs without a GPU.
set -u
FUSEKIT="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
passed=0

# expect CODE PATTERN -- command...: exit code and a line of stderr matching PATTERN.
expect() {
  local code="$1" pattern="$2"
  shift 3
  local err
  err="$("$@" 2>&1 >/dev/null)"
  local got=$?
  if [ "$got" != "$code" ] || ! grep -qE -- "$pattern" <<<"$err"; then
    echo "FAIL: $* -> exit $got (want $code), stderr: $err (want /$pattern/)"
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
}

# A foreign SQLite file, a corrupt file, a missing file, a store of another schema version.
python3 - "$work" <<'PY'
import sqlite3, sys
d = sys.argv[1]
c = sqlite3.connect(f"{d}/foreign.db"); c.execute("CREATE TABLE t(x)"); c.commit(); c.close()
open(f"{d}/corrupt.db", "wb").write(b"SQLite format 3\x00" + b"\x07" * 5000)
open(f"{d}/text.db", "w").write("not a database\n")
c = sqlite3.connect(f"{d}/v99.db")
c.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
c.executemany("INSERT INTO meta VALUES (?, ?)", [("application", "fusekit"), ("schema_version", "99")])
c.commit(); c.close()
PY
foreign_sum="$(sha256sum "$work/foreign.db")"

expect 2 "subcommand" -- "$FUSEKIT"
expect 2 "unknown subcommand 'frobnicate' \\(available: bench, cases, trace" -- "$FUSEKIT" frobnicate
expect 2 "db" -- "$FUSEKIT" summary
for cmd in summary report export; do
  extra=()
  [ "$cmd" = report ] && extra=(--format md)
  expect 2 "bogus|extra|not expected|argument" -- "$FUSEKIT" "$cmd" --db x.db --bogus "${extra[@]}"
  expect 1 "no such file" -- "$FUSEKIT" "$cmd" --db "$work/missing.db" "${extra[@]}"
  expect 1 "corrupt" -- "$FUSEKIT" "$cmd" --db "$work/corrupt.db" "${extra[@]}"
  expect 1 "not a fusekit store" -- "$FUSEKIT" "$cmd" --db "$work/text.db" "${extra[@]}"
  expect 1 "not a fusekit store" -- "$FUSEKIT" "$cmd" --db "$work/foreign.db" "${extra[@]}"
  expect 1 "schema version 99" -- "$FUSEKIT" "$cmd" --db "$work/v99.db" "${extra[@]}"
  expect 2 "run" -- "$FUSEKIT" "$cmd" --db "$work/foreign.db" --run -3 "${extra[@]}"
done
expect 2 "format" -- "$FUSEKIT" report --db x.db --format pdf
expect 2 "format" -- "$FUSEKIT" report --db x.db
expect 2 "table" -- "$FUSEKIT" report --db x.db --format csv --table nope
expect 2 "either --against" -- "$FUSEKIT" compare --db x.db
expect 1 "no such file" -- "$FUSEKIT" compare --db "$work/missing.db" --variants baseline,fused
expect 1 "corrupt" -- "$FUSEKIT" compare --db "$work/corrupt.db" --against "$work/corrupt.db"
expect 1 "not a fusekit store" -- "$FUSEKIT" compare --db "$work/foreign.db" --variants a,b
expect 2 "baseline" -- "$FUSEKIT" gate --candidate x.db
expect 2 "threshold|percentage" -- "$FUSEKIT" gate --baseline "$work/missing.db" --candidate x.db --threshold fast
expect 2 "alpha" -- "$FUSEKIT" gate --baseline "$work/missing.db" --candidate x.db --alpha 2
expect 1 "no such file" -- "$FUSEKIT" gate --baseline "$work/missing.db" --candidate "$work/missing.db"
expect 1 "corrupt" -- "$FUSEKIT" gate --baseline "$work/corrupt.db" --candidate "$work/corrupt.db"
expect 1 "not a fusekit store" -- "$FUSEKIT" gate --baseline "$work/foreign.db" --candidate "$work/foreign.db"
expect 2 "command" -- "$FUSEKIT" trace --db "$work/t.db"
expect 1 "not a fusekit store" -- "$FUSEKIT" trace --db "$work/foreign.db" -- true
expect 1 "corrupt" -- "$FUSEKIT" trace --db "$work/corrupt.db" -- true
expect 2 "reps|Range|range" -- "$FUSEKIT" bench --db "$work/b.db" --reps 0
expect 2 "sample-us|Range|range" -- "$FUSEKIT" bench --db "$work/b.db" --sample-us -1
expect 2 "suite" -- "$FUSEKIT" bench --db "$work/b.db" --suite nope
expect 1 "not a fusekit store" -- "$FUSEKIT" bench --db "$work/foreign.db"
expect 1 "corrupt" -- "$FUSEKIT" bench --db "$work/corrupt.db"
expect 2 "unknown operator" -- "$FUSEKIT" bench --db "$work/b.db" --op softmaxx --shape 8x8 --dtype fp16
expect 2 "unsupported shape" -- "$FUSEKIT" bench --db "$work/b.db" --op layernorm --shape 8by8 --dtype fp16
expect 2 "unsupported dtype" -- "$FUSEKIT" bench --db "$work/b.db" --op layernorm --shape 8x8 --dtype fp8
# Every shape syntax rejects a wrong count of sizes, signs, blanks and zeros with one clear line.
expect 2 "unsupported shape '\+8x8'" -- "$FUSEKIT" bench --db "$work/b.db" --op layernorm --shape +8x8 --dtype fp16
expect 2 "unsupported shape '8x8x8'" -- "$FUSEKIT" bench --db "$work/b.db" --op bias_gelu --shape 8x8x8 --dtype fp16
expect 2 "unsupported shape '64x12x128:p0.1'" -- "$FUSEKIT" bench --db "$work/b.db" --op bert_attention --shape 64x12x128:p0.1 --dtype fp16
expect 2 "unsupported shape '8x3x49x 32'" -- "$FUSEKIT" bench --db "$work/b.db" --op window_attention --shape "8x3x49x 32" --dtype fp16
expect 2 "unsupported shape '8x0x8:bias'" -- "$FUSEKIT" bench --db "$work/b.db" --op linear --shape 8x0x8:bias --dtype fp16
expect 2 "unsupported shape '8x8x8x8'" -- "$FUSEKIT" bench --db "$work/b.db" --op softmax --shape 8x8x8x8 --dtype fp16
expect 2 "unsupported shape '8xx8x8x8:none'" -- "$FUSEKIT" bench --db "$work/b.db" --op softmax --shape 8xx8x8x8:none --dtype fp16
expect 2 "needs --shape" -- "$FUSEKIT" bench --db "$work/b.db" --op layernorm
expect 2 "unknown operator 'softmaxx' in --ops" -- "$FUSEKIT" bench --db "$work/b.db" --suite ops --ops layernorm,softmaxx
expect 2 "selects operators of --suite ops, attention or models" -- "$FUSEKIT" bench --db "$work/b.db" --ops layernorm
expect 2 "peers|exist" -- "$FUSEKIT" bench --db "$work/b.db" --suite ops --peers "$work/missing.py"
expect 1 "schema version 99" -- "$FUSEKIT" bench --db "$work/v99.db"
# `cases`: the same selection errors as bench, without a store or a GPU; never over an SQLite file.
expect 2 "unknown operator suite 'demo'" -- "$FUSEKIT" cases --suite demo
expect 2 "unknown operator 'softmaxx'" -- "$FUSEKIT" cases --op softmaxx --shape 8x8 --dtype fp16
expect 2 "unsupported shape '8by8'" -- "$FUSEKIT" cases --op layernorm --shape 8by8 --dtype fp16
expect 2 "needs --shape" -- "$FUSEKIT" cases --op layernorm
expect 2 "has no backward" -- "$FUSEKIT" cases --op adamw --shape bert-base --dtype fp16 --backward
expect 2 "unknown operator 'softmaxx' in --ops" -- "$FUSEKIT" cases --ops layernorm,softmaxx
expect 2 "--ops swin_step:bf16 asks for another dtype than --dtype fp16" -- "$FUSEKIT" cases --suite models --dtype fp16 --ops swin_step:bf16
expect 2 "--ops swin_step@swin-s:b32: the models suite has no shape 'swin-s:b32' of swin_step .it has: swin-t:b128, swin-b:b64." -- "$FUSEKIT" cases --suite models --ops swin_step@swin-s:b32
expect 2 "selects operators of --suite ops, attention or models" -- "$FUSEKIT" cases --op layernorm --shape 8x8 --dtype fp16 --ops layernorm
expect 1 "SQLite file" -- "$FUSEKIT" cases --suite ops -o "$work/foreign.db"
expect 2 "argument|bogus|extra" -- "$FUSEKIT" trace --db "$work/t.db" --bogus -- true
expect 127 "^fusekit: cannot run .*no-such-program.: No such file or directory$" -- "$FUSEKIT" trace --db "$work/t.db" -- "$work/no-such-program"
lines="$(FUSEKIT_GIT_COMMIT=0000000000000000000000000000000000000000 "$FUSEKIT" trace --db "$work/t.db" -- "$work/no-such-program" 2>&1 >/dev/null | wc -l)"
if [ "$lines" = 1 ]; then passed=$((passed + 1)); else
  echo "FAIL: trace of a missing program: $lines lines on stderr (want 1)"
  failures=$((failures + 1))
fi
expect 1 "schema version 99" -- "$FUSEKIT" trace --db "$work/v99.db" -- true
expect 2 "^fusekit: FUSEKIT_GIT_COMMIT must be a full commit id .*not '0c9403b'$" -- env FUSEKIT_GIT_COMMIT=0c9403b "$FUSEKIT" trace --db "$work/short.db" -- true
if [ -e "$work/short.db" ]; then echo "FAIL: a refused FUSEKIT_GIT_COMMIT left a store"; failures=$((failures + 1)); else passed=$((passed + 1)); fi
# Without a GPU, bench says so in one line, exits 1 and creates no store (where a GPU is, it would run).
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect 1 "^fusekit: no GPU: " -- "$FUSEKIT" bench --db "$work/nogpu.db"
  # Without a driver at all, it says that, not CUDA's "driver version is insufficient".
  [ -e /proc/driver/nvidia/version ] ||
    expect 1 "^fusekit: no GPU: no NVIDIA driver is loaded on this machine$" -- "$FUSEKIT" bench --db "$work/nogpu.db"
  lines="$("$FUSEKIT" bench --db "$work/nogpu.db" 2>&1 >/dev/null | wc -l)"
  if [ "$lines" != 1 ] || [ -e "$work/nogpu.db" ]; then
    echo "FAIL: bench without a GPU: $lines lines on stderr (want 1), store created: $([ -e "$work/nogpu.db" ] && echo yes || echo no)"
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
fi

if [ "$foreign_sum" != "$(sha256sum "$work/foreign.db")" ]; then
  echo "FAIL: the foreign SQLite file was modified"
  failures=$((failures + 1))
else
  passed=$((passed + 1))
fi
# Help works and exits 0 for every subcommand.
for cmd in bench cases trace summary compare report export index gate; do
  if "$FUSEKIT" "$cmd" --help | grep -q -- "--"; then passed=$((passed + 1)); else
    echo "FAIL: fusekit $cmd --help"
    failures=$((failures + 1))
  fi
done
echo "cli_errors: $passed passed, $failures failed"
[ "$failures" = 0 ]
