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
[ $build_rc = 0 ] || { tail -n 60 "$OUT/build.log"; exit 1; }

(cd "$BUILD_DIR" && ctest --output-on-failure -j 4 --timeout 600) >"$OUT/ctest.log" 2>&1
ctest_rc=$?
grep -E "tests passed|Failed|\*\*\*|SKIPPED|Not Run" "$OUT/ctest.log" | head -40
grep -E "total GPU kernel time" -r "$BUILD_DIR/Testing/Temporary/LastTest.log" | head -3

"$BUILD_DIR/trace_overhead" | tee "$OUT/overhead.txt"

OUT_DIR="$OUT/run" bash scripts/run.sh >"$OUT/run.log" 2>&1
run_rc=$?
tail -n 30 "$OUT/run.log"

echo
echo "== device check: build $build_rc, ctest $ctest_rc, run.sh $run_rc"
grep -E "tests passed" "$OUT/ctest.log"
[ $ctest_rc = 0 ] && [ $run_rc = 0 ]
