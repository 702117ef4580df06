#!/usr/bin/env bash
# Sets up, builds and runs every test. GPU test programs report SKIPPED where no GPU is present.
# Ends with its own count of passed, skipped and failed tests: ctest's "100% tests passed" line
# counts skipped tests as passed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
# The report pages are checked in headless Chromium (tests/cpu/check_report_pages.py; skipped
# without one): install Debian's where apt can, so that a fresh machine runs that check too.
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && ! command -v google-chrome >/dev/null &&
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "fusekit test: installing chromium for the report pages' check"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 ||
    echo "fusekit test: chromium could not be installed; report_pages_in_browser will be skipped"
fi
cd "$BUILD_DIR"
log="$BUILD_DIR/ctest.log"
rc=0
ctest --output-on-failure -j "$(nproc)" "$@" 2>&1 | tee "$log" || rc=$?
# ctest's result column of each test line: Passed, ***Skipped, ***Failed, ***Timeout, Not Run...
result_lines() { grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log" || true; }
passed=$(result_lines | grep -cE ' Passed +[0-9.]+ sec$' || true)
skipped_names=$(result_lines | grep -E '\*\*\*Skipped' | sed -E 's/^.*Test +#[0-9]+: ([^ ]+) .*$/\1/' || true)
skipped=$(printf '%s' "$skipped_names" | grep -c . || true)
total=$(result_lines | wc -l)
failed=$((total - passed - skipped))
echo
echo "fusekit tests: $passed passed, $skipped skipped, $failed failed (of $total)"
[ "$skipped" = 0 ] || echo "skipped (no GPU or no browser here): $(echo $skipped_names)"
[ "$failed" = 0 ] && [ "$rc" = 0 ] || exit 1
