#!/usr/bin/env bash
# The CLI on good input, without a GPU: every read-only subcommand on a synthetic store, and the
# gate's exit code on a clear regression, on no change and on cases present on one side only.
set -u
FUSEKIT="$1"
MAKE_STORE="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
passed=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what="$1"
  shift
  if "$@" >"$work/cmd.out" 2>"$work/last.err"; then passed=$((passed + 1)); else
    echo "FAIL: $what: $(head -c 400 "$work/last.err")"
    failures=$((failures + 1))
  fi
  # A grep reads last.out: the output of the command before it.
  [ "$1" = grep ] || cp "$work/cmd.out" "$work/last.out"
}
check_code() {  # check_code CODE DESCRIPTION COMMAND...
  local code="$1" what="$2"
  shift 2
  "$@" >"$work/last.out" 2>"$work/last.err"
  local got=$?
  cat "$work/last.err" >>"$work/last.out"
  if [ "$got" = "$code" ]; then passed=$((passed + 1)); else
    echo "FAIL: $what: exit $got, want $code: $(head -c 400 "$work/last.err")"
    failures=$((failures + 1))
  fi
}

"$MAKE_STORE" "$work/a.db" 1000 500 1 || exit 1
"$MAKE_STORE" "$work/same.db" 1000 500 2 || exit 1
"$MAKE_STORE" "$work/slow.db" 1000 650 3 || exit 1

check "summary" "$FUSEKIT" summary --db "$work/a.db"
check "summary lists the kernel" grep -q "scale_kernel" "$work/last.out"
check "summary --range" "$FUSEKIT" summary --db "$work/a.db" --range step --short-names
check "summary short name" grep -q "fused_kernel" "$work/last.out"
check "summary shows the 2x speedup" "$FUSEKIT" summary --db "$work/a.db"
check "speedup in cases table" grep -Eq "(1\.9[0-9]|2\.0[0-9])x" "$work/last.out"
for format in csv md json html; do
  check "report $format" "$FUSEKIT" report --db "$work/a.db" --format "$format" -o "$work/report.$format"
  check "report $format is not empty" test -s "$work/report.$format"
done
# The HTML report: a section per operator; with --history, a chart of each case's median over the runs.
check "report html has the operator's section" grep -q '<section id="op-0">' "$work/report.html"
check "report html with --history" "$FUSEKIT" report --db "$work/a.db" --format html --history "$work/slow.db" \
  -o "$work/history.html"
check "it charts the medians over both runs" grep -q '<canvas id="history-0">' "$work/history.html"
check "a report of one run has no history" bash -c '! grep -q "<canvas id=\"history-0\">" "$1"' _ "$work/report.html"
check_code 2 "--history is for html" "$FUSEKIT" report --db "$work/a.db" --format md --history "$work/slow.db"
check_code 2 "--history of a missing store" "$FUSEKIT" report --db "$work/a.db" --format html --history "$work/none.db"
check "report csv kernels" "$FUSEKIT" report --db "$work/a.db" --run 1 --format csv --table kernels
check "csv has the nsys columns" grep -q "Instances" "$work/last.out"
check "report json parses" python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$work/report.json"
check "export" "$FUSEKIT" export --db "$work/a.db" -o "$work/trace.json"
check "export parses" python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['traceEvents']" "$work/trace.json"
check_code 1 "report refuses to overwrite a store" "$FUSEKIT" report --db "$work/a.db" --format md -o "$work/same.db"
check "the store it refused survives" "$FUSEKIT" summary --db "$work/same.db"
check "compare variants" "$FUSEKIT" compare --db "$work/a.db" --variants baseline,fused
check "compare two runs" "$FUSEKIT" compare --db "$work/a.db" --against "$work/slow.db"
check "compare markdown" "$FUSEKIT" compare --db "$work/a.db" --against "$work/slow.db" --markdown
check_code 0 "gate: no change" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/same.db"
check_code 1 "gate: 30% regression" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow.db" --markdown "$work/gate.md"
check "gate names the regression" grep -qi "regress" "$work/last.out"
check "gate wrote markdown" grep -q "|" "$work/gate.md"
check "gate markdown names the regressed case's kernels" grep -q "Kernels that moved most in" "$work/gate.md"
check_code 1 "gate --regressed-ops" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow.db" \
  --regressed-ops "$work/regressed.txt"
check "gate --regressed-ops lists the regressed operator" test "$(cat "$work/regressed.txt")" = scale_add
check_code 0 "gate --regressed-ops, no change" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/same.db" \
  --regressed-ops "$work/none.txt"
check "gate --regressed-ops is empty without a regression" test ! -s "$work/none.txt"
check_code 1 "gate --kernels: 30% regression" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow.db" --kernels
check "gate --kernels says the case marks no repetitions" grep -q "no rep ranges in either run" "$work/last.out"
check_code 0 "gate --ranges" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/same.db" --ranges --range-depth 1
check "gate --ranges says the case marks no repetitions" grep -q "NVTX ranges, 0/0 repetitions" "$work/last.out"
# Only fusekit's variants fail the gate by default: a slower libtorch baseline is shown, not gated.
"$MAKE_STORE" "$work/slow-baseline.db" 1300 500 4 || exit 1
check_code 0 "gate: a slower libtorch baseline is not gated" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow-baseline.db"
check "it is shown as not gated" grep -q "regressed (not gated)" "$work/last.out"
check_code 1 "gate --every-variant gates it" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow-baseline.db" --every-variant
check_code 0 "gate: 30% slower passes a 40% threshold" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/slow.db" --threshold 40%
check_code 0 "gate: improvement is not a regression" "$FUSEKIT" gate --baseline "$work/slow.db" --candidate "$work/a.db"
# make_test_store writes 30 samples a case: with 40 required nothing is tested, which is no pass.
check_code 1 "gate: too few samples is not a pass" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/same.db" --min-samples 40
check "it says which were not tested" grep -q "1 of 1 gated cases have fewer than 40 samples on a side and were not tested" "$work/last.out"
# History baselines: a store of several runs on one GPU (and one on another), and the candidate.
for seed in 11 12 13; do MAKE_TEST_STORE_GPU="GPU A" MAKE_TEST_STORE_COMMIT="abcdef0$seed" "$MAKE_STORE" "$work/history.db" 1000 500 "$seed" || exit 1; done
MAKE_TEST_STORE_GPU="GPU B" "$MAKE_STORE" "$work/history.db" 1000 200 14 || exit 1
MAKE_TEST_STORE_GPU="GPU A" "$MAKE_STORE" "$work/candidate.db" 1000 650 15 || exit 1
check_code 1 "gate --baseline-runs: 30% slower than the history" "$FUSEKIT" gate --baseline "$work/history.db" \
  --baseline-runs 5 --candidate "$work/candidate.db"
check "it pooled the three runs of the candidate's GPU" grep -q "baseline: 3 run(s) of .* on 'GPU A', samples pooled (runs 1 2 3)" "$work/last.out"
check_code 1 "gate --baseline-commit" "$FUSEKIT" gate --baseline "$work/history.db" --baseline-commit abcdef012 \
  --candidate "$work/candidate.db"
check "it took that commit's run" grep -q "baseline: run 2 of" "$work/last.out"
check_code 1 "gate --baseline-commit of no run" "$FUSEKIT" gate --baseline "$work/history.db" --baseline-commit 1234567 \
  --candidate "$work/candidate.db"
check "no run at that commit, said" grep -q "no finished run at commit 1234567" "$work/last.out"
check_code 2 "gate: two ways to choose the baseline" "$FUSEKIT" gate --baseline "$work/history.db" --baseline-run 1 \
  --baseline-runs 2 --candidate "$work/candidate.db"
MAKE_TEST_STORE_GPU="GPU C" "$MAKE_STORE" "$work/other.db" 1000 500 16 || exit 1
check_code 1 "gate --baseline-runs with no run of the GPU" "$FUSEKIT" gate --baseline "$work/history.db" \
  --baseline-runs 3 --candidate "$work/other.db"
check "no run of that GPU, said" grep -q "no finished run on the candidate's GPU ('GPU C')" "$work/last.out"
check_code 0 "gate: too few samples allowed" "$FUSEKIT" gate --baseline "$work/a.db" --candidate "$work/same.db" --min-samples 40 --allow-too-few-samples
check_code 1 "no such run" "$FUSEKIT" summary --db "$work/a.db" --run 7
check "index" "$FUSEKIT" index -o "$work/index.html" "a.html=$work/a.db" "slow.html=$work/slow.db"
check "index links both reports" grep -c 'href="a.html"' "$work/index.html"
check "index names the second" grep -q 'href="slow.html"' "$work/index.html"
check_code 2 "index entry without a store" "$FUSEKIT" index "$work/a.db"
check_code 1 "index of a missing store" "$FUSEKIT" index "x.html=$work/missing.db"
# STORE#RUN: one report per run of a store that holds several (history.db: commits abcdef011..13).
check "index of two runs of one store" "$FUSEKIT" index -o "$work/runs.html" "h1.html=$work/history.db#1" \
  "h2.html=$work/history.db#2"
check "run 1 listed" grep -q 'href="h1.html"' "$work/runs.html"
check "run 2 listed" grep -q 'href="h2.html"' "$work/runs.html"
check "each entry is its own run" python3 -c "import sys; t=open(sys.argv[1]).read(); sys.exit(0 if '(run 1)' in t and '(run 2)' in t else 1)" "$work/runs.html"
check_code 2 "index: run 0" "$FUSEKIT" index "x.html=$work/a.db#0"
check_code 1 "index: no such run" "$FUSEKIT" index "x.html=$work/a.db#9"
check_code 2 "index: a run id past any run" "$FUSEKIT" index "x.html=$work/a.db#99999999999999999999"
check_code 1 "summary of a range that does not exist" "$FUSEKIT" summary --db "$work/a.db" --range nope
check "it names the range and those that exist" grep -q "no NVTX range named 'nope' (its ranges: 'step'" "$work/last.out"
# Two runs of timed cases with none in common: an error, not a diff of every kernel.
cp "$work/slow.db" "$work/other.db"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"UPDATE cases SET name='demo/other/8/fp32'\"); c.commit()" "$work/other.db"
check_code 1 "compare of runs without a common case" "$FUSEKIT" compare --db "$work/a.db" --against "$work/other.db"
check "it says they share no case" grep -q "have no case (name and variant) in common" "$work/last.out"
# Training steps whose backward kernels come from a thread without ranges: by time, they belong to
# the step's backward range and to their case.
"$MAKE_STORE" "$work/steps.db" 1000 500 4 steps || exit 1
check "summary --categories" "$FUSEKIT" summary --db "$work/steps.db" --categories
check "categories: fused's GEMM share and us per rep" grep -Eq "^ +2 +0\.400 +75\.0 \(0\.300\) +25\.0 \(0\.100\) +fused " "$work/last.out"
check "nested ranges: the backward holds the other thread's kernels" grep -Eq "62\.5 \(0\.500\) +25\.0 \(0\.100\) +  backward" "$work/last.out"
check "summary --categories --range" "$FUSEKIT" summary --db "$work/steps.db" --categories --range step
check "by range name" grep -Eq "^ +-? +.* step$" "$work/last.out"
check_code 1 "summary --categories without case ranges" "$FUSEKIT" summary --db "$work/a.db" --categories
check "it says what to do" grep -q "no case whose range holds GPU work: name the ranges to break down with --range" "$work/last.out"
check "summary" "$FUSEKIT" summary --db "$work/steps.db"
check "backward holds nothing by thread" grep -Eq " 0 +backward$" "$work/last.out"
check "summary --project-ranges" "$FUSEKIT" summary --db "$work/steps.db" --project-ranges
check "backward holds the other thread's kernels" grep -Eq " 4 +backward$" "$work/last.out"
check "it counts the projected kernels" grep -q "^4 kernels placed by time (unranged projection)" "$work/last.out"
check "summary --project-ranges=all" "$FUSEKIT" summary --db "$work/steps.db" --project-ranges=all
check_code 2 "summary --project-ranges=sideways" "$FUSEKIT" summary --db "$work/steps.db" --project-ranges=sideways
check "report csv categories" "$FUSEKIT" report --db "$work/steps.db" --format csv --table categories
check "categories csv" grep -q "^1,demo/scale_add/1024/fp32,fused,2,4,0.800,0.400,75.00,0.300," "$work/last.out"
check "report csv step-ranges" "$FUSEKIT" report --db "$work/steps.db" --format csv --table step-ranges
check "step-ranges csv" grep -q "^1,demo/scale_add/1024/fp32,baseline,step > backward,2,62.50,0.500$" "$work/last.out"
check "report md" "$FUSEKIT" report --db "$work/steps.db" --format md --project-ranges
check "md: categories" grep -q "^## GPU time by kernel category" "$work/last.out"
check "md: step ranges" grep -q "| 62.5 (0.500) | 25.0 (0.100) | \`step > backward\` |" "$work/last.out"
check "md: projected range table" grep -q "(unranged projection)" "$work/last.out"
echo "cli_smoke: $passed passed, $failures failed"
[ "$failures" = 0 ]
