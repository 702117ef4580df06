#!/usr/bin/env bash
# The PyTorch side on a GPU machine: builds the operator library (torch_ops/), runs its pytest
# suites (tests/gpu/python: the ops, opcheck, fusekit.torch.patch on Hugging Face BERT, timm's and
# Hugging Face's Swin) and, with
# --bench, times the BERT step peer (scripts/peers/ops.py, cases of `fusekit cases --suite models`)
# with the unpatched and the fusekit-patched model, eager and compiled, without the tracer; with
# --overhead, the host cost per op and per BERT step (scripts/torch-op-overhead.py). The tests and
# the overhead run once per autograd formula set (FUSEKIT_TORCH_AUTOGRAD: python, cpp).
#   bash scripts/torch-check.sh [--overhead] [--bench CASES_JSON] [pytest arguments...]
# Environment: OUT (logs and results; default out/torch), BUILD_DIR (default build-device),
# FUSEKIT_TORCH_AUTOGRAD_MODES (default "python cpp"), FUSEKIT_TORCH_AUTOGRAD (the bench's; default cpp).
# Exit code: 0 when the build and every test passed (and the bench ran, if asked).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/torch}"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build-device}"
mkdir -p "$OUT"
cd "$ROOT" || exit 1
cases="" overhead=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) cases="$2"; shift 2 ;;
    --overhead) overhead=1; shift ;;
    *) break ;;
  esac
done
modes="${FUSEKIT_TORCH_AUTOGRAD_MODES:-python cpp}"

start=$SECONDS
if ! FUSEKIT_TARGETS="fusekit_torch_ops" bash scripts/setup.sh >"$OUT/build.log" 2>&1; then
  grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -60
  echo "torch-check: the build failed; see $OUT/build.log"
  exit 1
fi
library="$BUILD_DIR/torch_ops/libfusekit_torch_ops.so"
[ -f "$library" ] || { echo "torch-check: $library was not built (libtorch not found?)"; exit 1; }
echo "torch-check: built $library in $((SECONDS - start)) s"
export FUSEKIT_TORCH_OPS_LIBRARY="$library"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

failed=0
for mode in $modes; do
  for test in torch_ops_test torch_patch_bert_test torch_patch_swin_test torch_patch_hf_swin_test; do
    start=$SECONDS
    log="$OUT/$test-$mode.log"
    FUSEKIT_TORCH_AUTOGRAD=$mode python3 -m pytest -q -p no:cacheprovider -rs "$@" "tests/gpu/python/$test.py" \
      >"$log" 2>&1
    rc=$?
    [ $rc = 0 ] || failed=1
    echo "torch-check: $test, autograd $mode: rc $rc in $((SECONDS - start)) s: $(tail -n 1 "$log")"
    [ $rc = 0 ] || grep -E "^(FAILED|ERROR)|Error|error:|Fatal" "$log" | head -20
  done
  if [ $overhead = 1 ]; then
    echo "torch-check: host cost, autograd $mode"
    FUSEKIT_TORCH_AUTOGRAD=$mode python3 scripts/torch-op-overhead.py 2>&1 | tee "$OUT/overhead-$mode.log" |
      grep -vE "Warning|warn" | head -30
  fi
done

if [ -n "$cases" ]; then
  start=$SECONDS
  python3 scripts/peers/ops.py --cases "$cases" --results "$OUT/peers.jsonl" --reps "${FUSEKIT_PEER_REPS:-20}" \
    >"$OUT/peers.log" 2>&1
  rc=$?
  [ $rc = 0 ] || failed=1
  echo "torch-check: peers: rc $rc in $((SECONDS - start)) s"
  grep -E "fusekit|Error|error" "$OUT/peers.log" | head -30
  python3 - "$OUT/peers.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
base = {}
for r in rows:
    median = statistics.median(r["samples_ns"]) / 1e6
    peak = r.get("metrics", {}).get("peak_memory_bytes", 0) / 2**30
    base.setdefault(r["name"], {})[r["variant"]] = median
    eager = base[r["name"]].get("peer:eager")
    print(f"{r['name']:45s} {r['variant']:22s} median {median:8.3f} ms  peak {peak:6.2f} GiB"
          + (f"  {eager / median:5.2f}x eager" if eager else ""))
PY
fi
exit $failed
