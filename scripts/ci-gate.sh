#!/usr/bin/env bash
# The GPU CI job in one command: builds fusekit, measures the operators a change touches (or whole
# suites), gates the candidate run against the committed evidence of this GPU (or against the
# recent runs of a history store), writes the Markdown summary for a pull-request comment, and
# exits 1 on a regression.
#   bash scripts/ci-gate.sh [--base REF] [--ops LIST] [--suites ops,attention,models] [--dtype fp16]
#                           [--history DB [--history-runs N]] [--candidate-fusekit BIN] [--out DIR]
#                           [--every-variant] [--confirm-against BIN] [--no-confirm] [--dry-run]
#   --base REF       measure only the operators touched between REF and HEAD (scripts/touched_ops.py);
#                    without it, every case of the suites
#   --ops LIST       measure only these operators (comma-separated; with --base, those of them touched)
#   --candidate-fusekit BIN
#                    measure with this fusekit (a build of another commit: what the gate says about
#                    it, e.g. to bisect a regression) instead of HEAD's; HEAD's build still lists the
#                    cases and gates
#   --suites LIST    suites to consider (default ops,attention: the evidence's operator suites;
#                    add models for the whole BERT step)
#   --dtype DTYPE    the cases' dtype (default fp16, the evidence's)
#   --history DB     gate against the pooled samples of the newest --history-runs (default 5) runs of
#                    this GPU in DB instead of the evidence; the candidate run is recorded into DB
#                    (give it on the main branch's jobs, whose runs should become the history); while
#                    DB holds no run of this GPU, the evidence is the baseline
#   --every-variant  let the libtorch baseline, peers and references fail the job too (by default only
#                    fusekit's fused variants can: the others time code a change here does not touch, and
#                    are shown as not gated)
#   --confirm-against BIN
#                    confirm a regression by an A/B on this machine instead: the regressed operators are
#                    measured alternately with BIN (a build of the base commit, e.g. the merge base) and
#                    the candidate, two rounds (base then candidate, candidate then base), each round's
#                    candidate gated against its base; only a regression every round that ran shows fails
#                    the job (a machine slower than the evidence's, or one slow moment, fails neither
#                    round); a round whose benchmark or gate fails is left out, and with no round run
#                    the job fails without a verdict
#   --no-confirm     fail on the first measurement's regression; by default the operators of the
#                    regressed cases are measured once more (a fresh process, same baseline) and only a
#                    regression the re-run shows too fails the job, so that one slow moment of a
#                    shared or throttling GPU does not fail CI (both gates are in the summary)
#   --dry-run        say what would be measured and gated against, measure nothing (no GPU needed)
# Baseline: evidence/<gpu>/<suite>.db or .db.xz, <gpu> the GPU's short name (h100 for "NVIDIA H100
# 80GB HBM3"). Output in --out (default out/ci-gate): <suite>.db (the candidate runs), gate-<suite>.md
# and summary.md (every suite's Markdown, the comment to post).
# Exit code: 0 no regression (or nothing to measure), 1 a regression or a failure, 2 usage.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
base="" only="" suites="ops,attention" dtype="fp16" history="" history_runs=5 out="out/ci-gate" dry_run=0 confirm=1
gate_flags=()
measure_with="" confirm_with=""
usage() { echo "ci-gate: $1 (usage: bash scripts/ci-gate.sh [--base REF] [--ops LIST] [--suites LIST] [--dtype D] [--history DB [--history-runs N]] [--candidate-fusekit BIN] [--out DIR] [--every-variant] [--confirm-against BIN] [--no-confirm] [--dry-run])" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] || usage "--base needs a git ref"; base="$2"; shift 2 ;;
    --suites) [ $# -ge 2 ] || usage "--suites needs a list"; suites="$2"; shift 2 ;;
    --ops) [ $# -ge 2 ] && [ -n "$2" ] || usage "--ops needs a list of operators"; only="$2"; shift 2 ;;
    --candidate-fusekit) [ $# -ge 2 ] || usage "--candidate-fusekit needs a fusekit binary"; measure_with="$2"; shift 2 ;;
    --dtype) [ $# -ge 2 ] || usage "--dtype needs fp32, fp16 or bf16"; dtype="$2"; shift 2 ;;
    --history) [ $# -ge 2 ] || usage "--history needs a store"; history="$2"; shift 2 ;;
    --history-runs) [ $# -ge 2 ] || usage "--history-runs needs a count"; history_runs="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || usage "--out needs a folder"; out="$2"; shift 2 ;;
    --every-variant) gate_flags=(--every-variant); shift ;;
    --confirm-against) [ $# -ge 2 ] || usage "--confirm-against needs a fusekit binary"; confirm_with="$2"; shift 2 ;;
    --no-confirm) confirm=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
case "$dtype" in fp32 | fp16 | bf16) ;; *) usage "--dtype must be fp32, fp16 or bf16, not '$dtype'" ;; esac
if [ -n "$measure_with" ]; then  # relative to where the script was called from
  [[ "$measure_with" == /* ]] || measure_with="$OLDPWD/$measure_with"
  [ -f "$measure_with" ] && [ -x "$measure_with" ] || usage "--candidate-fusekit '$measure_with' is not an executable"
  [ -z "$history" ] || usage "--candidate-fusekit measures another build: its runs do not belong in --history"
fi
if [ -n "$confirm_with" ]; then
  [[ "$confirm_with" == /* ]] || confirm_with="$OLDPWD/$confirm_with"
  [ -f "$confirm_with" ] && [ -x "$confirm_with" ] || usage "--confirm-against '$confirm_with' is not an executable"
  [ "$confirm" = 1 ] || usage "--confirm-against confirms a regression: it cannot go with --no-confirm"
fi
[[ "$history_runs" =~ ^[1-9][0-9]*$ ]] || usage "--history-runs must be a positive count, not '$history_runs'"
mkdir -p "$out"

if [ "$dry_run" = 0 ]; then
  FUSEKIT_TARGETS="fusekit" bash scripts/setup.sh >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; echo "ci-gate: the build failed" >&2; exit 1; }
fi
FUSEKIT="${BUILD_DIR:-$ROOT/build}/fusekit"
[ -x "$FUSEKIT" ] || { echo "ci-gate: $FUSEKIT is missing (build it first, or run without --dry-run)" >&2; exit 1; }
MEASURE="${measure_with:-$FUSEKIT}"  # the fusekit whose kernels are measured
label="ci-gate $(git rev-parse --short HEAD 2>/dev/null)"
[ -z "$measure_with" ] || label="ci-gate, the kernels of another build (--candidate-fusekit)"
if [ -n "$only" ]; then
  listed="$(for s in ${suites//,/ }; do "$FUSEKIT" cases --suite "$s" --dtype "$dtype"; done 2>/dev/null |
    python3 -c 'import re, sys; print(",".join(sorted(set(re.findall(r"\"op\": \"([a-z0-9_]+)\"", sys.stdin.read())))))')"
  unknown="$(python3 -c 'import sys; print(",".join(sorted(set(sys.argv[1].split(",")) - set(sys.argv[2].split(",")))))' "$only" "$listed")"
  [ -z "$unknown" ] || usage "--ops: no operator '$unknown' in the suites $suites"
fi

# The GPU's short name: the first word like h100, a100, l40s in its name.
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
gpu_key="$(printf '%s' "$gpu_name" | tr 'A-Z' 'a-z' | grep -oE '\b[a-z]{1,2}[0-9]{2,4}[a-z]?\b' | head -n 1)"
if [ -z "$gpu_name" ]; then
  [ "$dry_run" = 1 ] || { echo "ci-gate: no GPU on this machine (nvidia-smi found none): nothing can be measured" >&2; exit 1; }
  gpu_key="${CI_GATE_GPU:-h100}"
  echo "ci-gate: dry run without a GPU: planning for evidence/$gpu_key"
fi

touched=""
if [ -n "$base" ]; then
  git rev-parse --verify --quiet "$base^{commit}" >/dev/null || usage "--base '$base' is not a commit here"
  known="$(for s in ${suites//,/ }; do "$FUSEKIT" cases --suite "$s" --dtype "$dtype"; done 2>/dev/null |
    python3 -c 'import re, sys; print(",".join(sorted(set(re.findall(r"\"op\": \"([a-z0-9_]+)\"", sys.stdin.read())))))')"
  touched="$(git diff --name-only "$base"...HEAD | python3 scripts/touched_ops.py --known "$known")"
  if [ -n "$only" ] && [ -n "$touched" ]; then
    if [ "$touched" = all ]; then
      touched="$only"
    else
      touched="$(python3 -c 'import sys; print(",".join(sorted(set(sys.argv[1].split(",")) & set(sys.argv[2].split(",")))))' "$touched" "$only")"
    fi
  fi
  if [ -z "$touched" ]; then
    echo "ci-gate: no benchmarked operator is touched between $base and HEAD: nothing to measure"
    printf '**fusekit gate**: no benchmarked operator changed since `%s`.\n' "$base" >"$out/summary.md"
    exit 0
  fi
  echo "ci-gate: touched since $base: $touched"
elif [ -n "$only" ]; then
  touched="$only"
fi

failed=0 regressed=0
: >"$out/summary.md"
for suite in ${suites//,/ }; do
  ops=()
  if [ -n "$touched" ] && [ "$touched" != all ]; then
    suite_ops="$("$FUSEKIT" cases --suite "$suite" --dtype "$dtype" 2>/dev/null |
      python3 -c 'import re, sys; print(",".join(sorted(set(re.findall(r"\"op\": \"([a-z0-9_]+)\"", sys.stdin.read())))))')"
    mine="$(python3 -c 'import sys; a = set(sys.argv[1].split(",")); print(",".join(sorted(a & set(sys.argv[2].split(",")))))' "$touched" "$suite_ops")"
    [ -n "$mine" ] || { echo "ci-gate: $suite: no touched operator"; continue; }
    ops=(--ops "$mine")
  fi
  # A history store with no finished run of this GPU yet (the first job) gates against the evidence.
  prior=0
  if [ -n "$history" ] && [ -s "$history" ]; then
    prior="$(python3 -c 'import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(db.execute("SELECT COUNT(*) FROM runs WHERE gpuName = ? AND status = ?", (sys.argv[2], "ok")).fetchone()[0])' \
      "$history" "$gpu_name" 2>/dev/null || echo 0)"
  fi
  if [ -n "$history" ] && [ "$prior" -gt 0 ]; then
    baseline=(--baseline "$history" --baseline-runs "$history_runs")
    what="the newest $history_runs runs on this GPU in $history"
  else
    evidence=""
    for candidate in "evidence/$gpu_key/$suite.db" "evidence/$gpu_key/$suite.db.xz"; do
      [ -e "$candidate" ] && evidence="$candidate" && break
    done
    if [ -z "$evidence" ]; then
      echo "ci-gate: $suite: no evidence/$gpu_key/$suite.db(.xz) to gate against: skipped (measure and commit one first)"
      continue
    fi
    if [ "$dry_run" != 1 ] && [[ "$evidence" == *.xz ]]; then
      xz -dc "$evidence" >"$out/baseline-$suite.db" || { echo "ci-gate: cannot decompress $evidence" >&2; failed=1; continue; }
      evidence="$out/baseline-$suite.db"
    fi
    baseline=(--baseline "$evidence")
    what="$evidence"
  fi
  echo "ci-gate: $suite: measure ${ops[*]:-every case} ($dtype), gate against $what"
  if [ "$dry_run" = 1 ]; then
    [ -z "$confirm_with" ] || echo "ci-gate: $suite: a regression is confirmed by two A/B rounds against $confirm_with"
    continue
  fi
  candidate_db="$out/$suite.db"
  if [ -n "$history" ]; then
    candidate_db="$history"  # a new run in the history store; the gate leaves it out of the baseline
  else
    rm -f "$candidate_db" "$candidate_db-wal" "$candidate_db-shm"
  fi
  peers=()
  [ "$suite" = models ] && python3 -c 'import torch' 2>/dev/null && peers=(--peers scripts/peers/ops.py)
  if ! "$MEASURE" bench --suite "$suite" --dtype "$dtype" "${ops[@]}" "${peers[@]}" --db "$candidate_db" \
    --label "$label" >"$out/bench-$suite.log" 2>&1; then
    tail -20 "$out/bench-$suite.log"
    echo "ci-gate: $suite: the benchmark failed" >&2
    failed=1
    continue
  fi
  rm -f "$out/gate-$suite.md" "$out/regressed-$suite.txt"
  "$FUSEKIT" gate "${baseline[@]}" "${gate_flags[@]}" --candidate "$candidate_db" --markdown "$out/gate-$suite.md" \
    --regressed-ops "$out/regressed-$suite.txt"
  rc=$?
  # Exit 1 is a regression or an error (or untested cases); a regression names its operators.
  if [ $rc = 1 ] && [ ! -s "$out/regressed-$suite.txt" ]; then
    echo "ci-gate: $suite: the gate failed without naming a regressed operator (see above)" >&2
    rc=2
  fi
  { printf '### fusekit gate: %s suite (%s, %s)\n\n' "$suite" "$gpu_name" "$dtype"; cat "$out/gate-$suite.md" 2>/dev/null; echo; } >>"$out/summary.md"
  # Confirm a regression by measuring its operators again before failing.
  if [ $rc = 1 ] && [ $confirm = 1 ] && [ -s "$out/regressed-$suite.txt" ] && [ -n "$confirm_with" ]; then
    again="$(sort -u "$out/regressed-$suite.txt" | paste -sd, -)"
    echo "ci-gate: $suite: regressed in $again; two A/B rounds against $confirm_with before failing"
    rounds=0 confirmed=0
    for round in 1 2; do
      base_db="$out/$suite-ab$round-base.db" cand_db="$out/$suite-ab$round-candidate.db"
      rm -f "$base_db" "$base_db-wal" "$base_db-shm" "$cand_db" "$cand_db-wal" "$cand_db-shm"
      order=(base candidate)
      [ $round = 2 ] && order=(candidate base)
      ok=1
      for side in "${order[@]}"; do
        if [ "$side" = base ]; then binary="$confirm_with" db="$base_db"; else binary="$MEASURE" db="$cand_db"; fi
        if ! "$binary" bench --suite "$suite" --dtype "$dtype" --ops "$again" "${peers[@]}" --db "$db" \
          --label "$label (A/B round $round, $side)" >"$out/bench-$suite-ab$round-$side.log" 2>&1; then
          ok=0
          break
        fi
      done
      if [ $ok = 0 ]; then
        echo "ci-gate: $suite: A/B round $round: the $side benchmark failed (see bench-$suite-ab$round-$side.log)" >&2
        printf '#### A/B round %s: the %s benchmark failed; left out\n\n' "$round" "$side" >>"$out/summary.md"
        continue
      fi
      rm -f "$out/gate-$suite-ab$round.md" "$out/regressed-$suite-ab$round.txt"
      "$FUSEKIT" gate --baseline "$base_db" "${gate_flags[@]}" --candidate "$cand_db" \
        --markdown "$out/gate-$suite-ab$round.md" --regressed-ops "$out/regressed-$suite-ab$round.txt" \
        >"$out/gate-$suite-ab$round.txt" 2>&1
      round_rc=$?
      # Exit 1 is a regression or an error; a regression names its operators.
      if [ $round_rc = 0 ]; then
        rounds=$((rounds + 1))
        echo "ci-gate: $suite: A/B round $round: no regression against the base build"
      elif [ $round_rc = 1 ] && [ -s "$out/regressed-$suite-ab$round.txt" ]; then
        rounds=$((rounds + 1)) confirmed=$((confirmed + 1))
        echo "ci-gate: $suite: A/B round $round: regressed in $(sort -u "$out/regressed-$suite-ab$round.txt" | paste -sd, -)"
      else
        tail -3 "$out/gate-$suite-ab$round.txt" >&2
        echo "ci-gate: $suite: A/B round $round: the gate failed" >&2
        printf '#### A/B round %s: the gate failed; left out\n\n' "$round" >>"$out/summary.md"
        continue
      fi
      { printf '#### A/B round %s against the base build (%s)\n\n' "$round" "$again"
        cat "$out/gate-$suite-ab$round.md"; echo; } >>"$out/summary.md"
    done
    if [ $rounds = 0 ]; then
      verdict="no A/B round ran, so nothing confirms or clears the first measurement: the job fails without a verdict"
      rc=2
    elif [ $confirmed = $rounds ]; then
      verdict="confirmed by $rounds of 2 A/B round(s) against the base build"
    else
      verdict="not confirmed: $((rounds - confirmed)) of $rounds A/B round(s) show no regression against the base build, so this suite passes"
      rc=0
    fi
    echo "ci-gate: $suite: $verdict"
    printf '#### A/B confirmation (%s): %s\n\n' "$again" "$verdict" >>"$out/summary.md"
  elif [ $rc = 1 ] && [ $confirm = 1 ] && [ -s "$out/regressed-$suite.txt" ]; then
    again="$(sort -u "$out/regressed-$suite.txt" | paste -sd, -)"
    echo "ci-gate: $suite: regressed in $again; measuring them again before failing"
    confirm_db="$out/$suite-confirm.db"
    rm -f "$confirm_db" "$confirm_db-wal" "$confirm_db-shm" "$out/gate-$suite-confirm.md"
    if "$MEASURE" bench --suite "$suite" --dtype "$dtype" --ops "$again" "${peers[@]}" --db "$confirm_db" \
      --label "$label (confirming)" >"$out/bench-$suite-confirm.log" 2>&1; then
      "$FUSEKIT" gate "${baseline[@]}" "${gate_flags[@]}" --candidate "$confirm_db" --markdown "$out/gate-$suite-confirm.md"
      rc=$?
      case $rc in
        0) verdict="not confirmed: the re-run of $again shows no regression, so this suite passes" ;;
        1) verdict="confirmed by a re-run of $again" ;;
        *) verdict="the re-run's gate failed" ;;
      esac
      echo "ci-gate: $suite: $verdict"
      { printf '#### Re-run of the regressed operators (%s): %s\n\n' "$again" "$verdict"
        cat "$out/gate-$suite-confirm.md"; echo; } >>"$out/summary.md"
    else
      tail -20 "$out/bench-$suite-confirm.log"
      echo "ci-gate: $suite: the re-run's benchmark failed; the first measurement stands" >&2
    fi
  fi
  case $rc in
    0) ;;
    1) regressed=1 ;;
    *) failed=1 ;;
  esac
done
[ "$dry_run" = 1 ] && exit 0
echo "ci-gate: summary in $out/summary.md"
[ $failed = 0 ] || { echo "ci-gate: a build, measurement or gate failed (above): no verdict" >&2; exit 1; }
[ $regressed = 0 ] || { echo "ci-gate: a regression: see $out/summary.md"; exit 1; }
exit 0
