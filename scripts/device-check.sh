#!/usr/bin/env bash
# The one call on the GPU machine: build everything (libtorch targets included), run every test
# (GPU ones too), measure the tracing overhead, run the main job, and print a short table last.
# Needs .deps/ from scripts/device-deps.sh. Writes logs and the store under $OUT (or out/device).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/device}"
mkdir -p "$OUT"
export BUILD_DIR="$ROOT/build-device"
cd "$ROOT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader || true

bash scripts/setup.sh >"$OUT/build.log" 2>&1
build_rc=$?
tail -n 5 "$OUT/build.log"
[ $build_rc = 0 ] || { grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }

# CPU tests in parallel; GPU tests one at a time, so no test's kernels share the GPU with another's.
(cd "$BUILD_DIR" && ctest --output-on-failure -j 8 -LE gpu --timeout 300 &&
  ctest --output-on-failure -j 1 -L gpu --timeout 300 -V) >"$OUT/ctest.log" 2>&1
ctest_rc=$?
grep -E "tests passed|Failed|\*\*\*|SKIPPED|Not Run" "$OUT/ctest.log" | head -40
grep -E "total GPU kernel time|Skipped|SKIPPED" "$OUT/ctest.log" | head -5

"$BUILD_DIR/tests/gpu/trace_overhead" | tee "$OUT/overhead.txt"

# A PyTorch training loop traced from outside: what `fusekit trace` shows a user.
FUSEKIT_TRACE_VERBOSE=1 "$BUILD_DIR/fusekit" trace --db "$OUT/torch_loop.db" --label "torch_train_loop.py" -- \
  python3 tests/gpu/torch_train_loop.py --steps 30 2>&1 | tail -n 3
"$BUILD_DIR/fusekit" summary --db "$OUT/torch_loop.db" --range train_loop --short-names --top 8 | cut -c1-160

run_dir="$(mktemp -d)"
OUT_DIR="$run_dir" bash scripts/run.sh >"$OUT/run.log" 2>&1
run_rc=$?
cp "$run_dir/fusekit.db" "$OUT/demo.db" 2>/dev/null
cp "$run_dir/report.html" "$OUT/demo.html" 2>/dev/null
tail -n 30 "$OUT/run.log"

echo
echo "== device check: build $build_rc, ctest $ctest_rc, run.sh $run_rc"
grep -E "tests passed" "$OUT/ctest.log"
[ $ctest_rc = 0 ] && [ $run_rc = 0 ]
