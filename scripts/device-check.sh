#!/usr/bin/env bash
# The calls on the GPU machine: build everything (libtorch targets included), then the stages named
# on the command line (default: all of them), and a short table last.
#   tests      every test, GPU ones one at a time
#   sanitize   compute-sanitizer memcheck and racecheck on the operators' GPU tests (small shapes)
#   overhead   the tracer's cost per kernel launch, and a PyTorch loop traced from outside
#   suite      the main job (scripts/run.sh): the operator suite with its peers, and its reports
# Needs .deps/ from scripts/device-deps.sh. Writes logs, stores and reports under $OUT (or out/device).
# FUSEKIT_TARGETS="fusekit" builds only the CLI (enough for the suite stage; about half the build).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/device}"
mkdir -p "$OUT"
export BUILD_DIR="$ROOT/build-device"
cd "$ROOT"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests sanitize overhead suite)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader || true

start=$SECONDS
bash scripts/setup.sh >"$OUT/build.log" 2>&1
build_rc=$?
summary+=("build: rc $build_rc in $((SECONDS - start)) s")
[ $build_rc = 0 ] || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }

if want tests; then
  start=$SECONDS
  # CPU tests in parallel; GPU tests one at a time, so no test's kernels share the GPU with another's.
  # FUSEKIT_TESTS="window|bert" runs only the GPU test programs whose names match (a regex), each
  # as a whole (all of them take longer than one call on the GPU machine allows).
  if [ -n "${FUSEKIT_TESTS:-}" ]; then
    (cd "$BUILD_DIR" && ctest --output-on-failure -j 8 -LE gpu --timeout 300) >"$OUT/ctest.log" 2>&1
    tests_rc=$?
    for test in "$BUILD_DIR"/tests/gpu/*_test; do
      [[ "$(basename "$test")" =~ $FUSEKIT_TESTS ]] || continue
      timeout 300 "$test" --gtest_brief=1 >>"$OUT/ctest.log" 2>&1 || tests_rc=1
      echo "$(basename "$test"): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/ctest.log" | tail -1)"
    done
  else
    (cd "$BUILD_DIR" && ctest --output-on-failure -j 8 -LE gpu --timeout 300 &&
      ctest --output-on-failure -j 1 -L gpu --timeout 300) >"$OUT/ctest.log" 2>&1
    tests_rc=$?
  fi
  grep -E "Failed|\*\*\*|Not Run" "$OUT/ctest.log" | head -40
  grep -B5 -A25 -E "\[  FAILED  \]" "$OUT/ctest.log" | grep -E "Failure|Expected|Which is|error|FAILED|  Actual|value of" | head -60
  summary+=("tests: rc $tests_rc in $((SECONDS - start)) s: $(grep -E 'tests passed' "$OUT/ctest.log" | tr '\n' ' ')")
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
