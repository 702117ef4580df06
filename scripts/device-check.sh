#!/usr/bin/env bash
# The calls on the GPU machine: build everything (libtorch targets included), then the stages named
# on the command line (default: all of them), and a short table last.
#   tests       the CPU tests, and the GPU test programs labelled gpu one at a time (one call)
#   tests-long  the GPU test programs' long cases (ctest label long), one at a time (a second call)
#   sanitize    compute-sanitizer memcheck and racecheck on the operators' GPU tests (small shapes)
#   overhead    the tracer's cost per kernel launch, and a PyTorch loop traced from outside
#   suite       the main job (scripts/run.sh): the operator suite with its peers, and its reports
# tests and tests-long are sized for one 10-minute call each on the H100, once the build is done
# (the long cases were chosen by their sizes; the summary names the slowest programs of each).
# Needs .deps/ from scripts/device-deps.sh. Writes logs, stores and reports under $OUT (or out/device).
# FUSEKIT_TARGETS="fusekit" builds only the CLI (enough for the suite stage; about half the build).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/device}"
mkdir -p "$OUT"
export BUILD_DIR="$ROOT/build-device"
cd "$ROOT"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests tests-long sanitize overhead suite)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader || true

start=$SECONDS
bash scripts/setup.sh >"$OUT/build.log" 2>&1
build_rc=$?
summary+=("build: rc $build_rc in $((SECONDS - start)) s")
[ $build_rc = 0 ] || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }

# Runs the GPU test programs of one ctest label (an anchored regex: ^gpu$ or ^long$), one at a time
# so that no two programs' kernels share the GPU, into a log; FUSEKIT_TESTS="window|bert" keeps only
# the programs whose ctest names match (a regex). A ctest test is a whole program (or its long cases),
# so the counts below are of programs. Prints the failures and adds a line to the summary.
run_gpu_tests() {
  local stage="$1" label="$2" timeout="$3" log="$4" start=$SECONDS rc
  (cd "$BUILD_DIR" && ctest --output-on-failure -j 1 -L "$label" ${FUSEKIT_TESTS:+-R "$FUSEKIT_TESTS"} \
    --timeout "$timeout") >"$log" 2>&1
  rc=$?
  local results passed skipped failed slowest
  results="$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log")"
  passed=$(grep -c ' Passed ' <<<"$results")
  skipped=$(grep -c '\*\*\*Skipped' <<<"$results")
  failed=$(($(grep -c . <<<"$results") - passed - skipped))
  slowest="$(grep ' Passed ' <<<"$results" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 s \1/' |
    sort -rn | head -3 | tr '\n' ',' | sed 's/,$//; s/,/, /g')"
  grep -E '\*\*\*(Failed|Timeout|Exception)|Not Run' <<<"$results"
  grep -B5 -A25 -E "\[  FAILED  \]" "$log" | grep -E "Failure|Expected|Which is|error|FAILED|  Actual|value of" | head -60
  summary+=("$stage: rc $rc in $((SECONDS - start)) s: programs $passed passed, $failed failed, $skipped skipped${slowest:+ (slowest: $slowest)}")
  return $rc
}

if want tests; then
  start=$SECONDS
  # CPU tests in parallel (every test labelled neither gpu nor long).
  (cd "$BUILD_DIR" && ctest --output-on-failure -j 8 -LE 'gpu|long' --timeout 300) >"$OUT/ctest-cpu.log" 2>&1
  cpu_rc=$?
  grep -E "Failed|\*\*\*|Not Run" "$OUT/ctest-cpu.log" | head -40
  summary+=("cpu tests: rc $cpu_rc in $((SECONDS - start)) s: $(grep -E 'tests passed' "$OUT/ctest-cpu.log" | tr '\n' ' ')")
  # The quick GPU tests: each program whole but for its long cases.
  run_gpu_tests tests '^gpu$' 300 "$OUT/ctest-gpu.log"
fi

if want tests-long; then
  # The long cases (tests/gpu/CMakeLists.txt lists them), in a call of their own.
  run_gpu_tests tests-long '^long$' 540 "$OUT/ctest-long.log"
fi

if want sanitize; then
  start=$SECONDS
  sanitize_rc=0
  # racecheck itself: a write after a group's named barrier, read by other groups after
  # __syncthreads(), is reported where the groups took different numbers of barriers (argument 1)
  # and not where they took the same (0, 2); tests/gpu/racecheck_named_barrier_probe.cu says why
  # it matters. Printed, not counted in the stage's exit code.
  for named in 0 1 2; do
    summary+=("racecheck probe, named barriers $named: $(compute-sanitizer --tool racecheck \
      "$BUILD_DIR/tests/gpu/racecheck_named_barrier_probe" "$named" 2>&1 | grep -E 'RACECHECK SUMMARY' | cut -c30-)")
  done
  for test in "$BUILD_DIR"/tests/gpu/*_test; do
    name="$(basename "$test")"
    case "$name" in tracer_test | trace_command_test | demo_test | *_torch_test) continue ;; esac
    # FUSEKIT_SANITIZE="a_test b_test" limits the stage to those tests.
    [ -n "${FUSEKIT_SANITIZE:-}" ] && [[ " $FUSEKIT_SANITIZE " != *" $name "* ]] && continue
    for tool in memcheck racecheck; do
      # The small shapes: a sanitizer slows kernels down by orders of magnitude.
      if ! timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$test" --gtest_filter='*:-*1000000*:*million*:*Million*' \
        >"$OUT/sanitize-$name-$tool.log" 2>&1; then
        sanitize_rc=1
        echo "sanitize: $name $tool FAILED"
        grep -E "ERROR SUMMARY|Invalid|Race|FAILED" "$OUT/sanitize-$name-$tool.log" | head -8
      fi
      summary+=("sanitize $name $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$name-$tool.log" | tail -1)")
    done
  done
  cat "$OUT"/sanitize-*.log >"$OUT/sanitize.log" 2>/dev/null
  rm -f "$OUT"/sanitize-*.log
  summary+=("sanitize: rc $sanitize_rc in $((SECONDS - start)) s")
fi

if want overhead; then
  "$BUILD_DIR/tests/gpu/trace_overhead" | tee "$OUT/overhead.txt"
  FUSEKIT_TRACE_VERBOSE=1 "$BUILD_DIR/fusekit" trace --db "$OUT/torch_loop.db" --label "torch_train_loop.py" -- \
    python3 tests/gpu/torch_train_loop.py --steps 30 2>&1 | tail -n 3
  "$BUILD_DIR/fusekit" summary --db "$OUT/torch_loop.db" --range train_loop --short-names --top 8 | cut -c1-160
fi

if want suite; then
  start=$SECONDS
  run_dir="$(mktemp -d)"
  # FUSEKIT_SUITE_TIMEOUT bounds the main job; what it recorded by then stays in the store.
  OUT_DIR="$run_dir" timeout "${FUSEKIT_SUITE_TIMEOUT:-3600}" bash scripts/run.sh >"$OUT/run.log" 2>&1
  suite_rc=$?
  # The store travels compressed, in pieces of 15 MB (join them with cat); the reports as they are.
  xz -T8 -3 -c "$run_dir/fusekit.db" | split -b 15M - "$OUT/${FUSEKIT_SUITE:-ops}.db.xz."
  cp "$run_dir/report.html" "$OUT/${FUSEKIT_SUITE:-ops}.html" 2>/dev/null
  cp "$run_dir/cases.csv" "$OUT/${FUSEKIT_SUITE:-ops}.csv" 2>/dev/null
  cp "$run_dir/report.md" "$OUT/${FUSEKIT_SUITE:-ops}.md" 2>/dev/null
  grep -E "^fusekit|Error|error" "$OUT/run.log" | tail -n 12
  summary+=("suite: rc $suite_rc in $((SECONDS - start)) s")
fi

echo
echo "== device check (${stages[*]})"
printf '%s\n' "${summary[@]}"
