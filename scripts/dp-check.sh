#!/usr/bin/env bash
# The data-parallel checks on a GPU machine: builds the dp/ test programs, runs the one-GPU tests
# (top-k selection, error feedback, the collectives as one rank), then the collectives across 2 and
# 4 ranks, one process per GPU, started by torchrun (--no-python --standalone) or else mpirun, and
# prints a summary: per run its exit code, the ranks that passed, and rank 0's table of bytes sent,
# times and loads per collective.
#   bash scripts/dp-check.sh [ranks ...]     (default: 2 4; counts above the GPUs present are skipped)
# Needs .deps/ from scripts/device-deps.sh where the machine has no registry (as device-check.sh).
# Environment: OUT (logs; default out/dp), FUSEKIT_DP_TIMEOUT (seconds a run, default 300),
# FUSEKIT_DP_ELEMENTS and FUSEKIT_DP_REPS (passed to the program), NCCL_DEBUG (default WARN).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/dp}"
mkdir -p "$OUT"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build-device}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
timeout_s="${FUSEKIT_DP_TIMEOUT:-300}"
cd "$ROOT" || exit 1
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(2 4)
summary=()

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || echo "dp-check: no nvidia-smi"
echo "dp-check: $gpus GPU(s) visible"

start=$SECONDS
FUSEKIT_TARGETS="dp_collective_test error_feedback_test topk_selection_test" bash scripts/setup.sh >"$OUT/build.log" 2>&1
build_rc=$?
grep -E 'fusekit: (NCCL|left out)' "$OUT/build.log"
summary+=("build: rc $build_rc in $((SECONDS - start)) s")
program="$BUILD_DIR/tests/gpu/dp_collective_test"
if [ $build_rc != 0 ] || [ ! -x "$program" ]; then
  grep -B2 -A12 -E "error|Error" "$OUT/build.log" | head -60
  echo "dp-check: the build failed or left dp_collective_test out (NCCL not found?); see $OUT/build.log"
  exit 1
fi

# A log without a launcher's "[rank0]:" prefixes.
plain() { sed -E 's/^\[rank[0-9]+\]://' "$1"; }

# Rank 0's tables of one log.
tables_of() { plain "$1" | grep -A 9 '^dp_collective: ' | grep -E '^(dp_collective:|  )'; }

# Passed / failed / skipped cases of one GoogleTest log (summed over the ranks that wrote into it).
cases_of() {
  local passed failed skipped
  passed=$(plain "$1" | grep -E '^\[  PASSED  \] [0-9]+ test' | awk '{s += $4} END {print s + 0}')
  failed=$(plain "$1" | grep -E '^\[  FAILED  \] [0-9]+ test' | awk '{s += $4} END {print s + 0}')
  skipped=$(plain "$1" | grep -E '^\[  SKIPPED \] [0-9]+ test' | awk '{s += $4} END {print s + 0}')
  echo "cases $passed passed, $failed failed, $skipped skipped"
}

# One-GPU programs, alone (WORLD_SIZE unset: the collective test runs as one rank).
failed_any=0
tables=()
for test in topk_selection_test error_feedback_test dp_collective_test; do
  start=$SECONDS
  env -u RANK -u WORLD_SIZE timeout --kill-after=10 "$timeout_s" "$BUILD_DIR/tests/gpu/$test" --gtest_brief=1 \
    >"$OUT/$test.log" 2>&1
  rc=$?
  [ $rc = 0 ] || failed_any=1
  summary+=("$test, 1 GPU: rc $rc in $((SECONDS - start)) s: $(cases_of "$OUT/$test.log")")
  grep -E 'Failure|FAILED|Expected|Which is|error' "$OUT/$test.log" | head -20
done
tables+=("$(tables_of "$OUT/dp_collective_test.log")")

# The launcher: torchrun (or python3 -m torch.distributed.run), else mpirun.
launcher=()
if command -v torchrun >/dev/null; then
  launcher=(torchrun --no-python --standalone)
elif python3 -c 'import torch.distributed.run' 2>/dev/null; then
  launcher=(python3 -m torch.distributed.run --no-python --standalone)
elif command -v mpirun >/dev/null; then
  launcher=(mpirun --allow-run-as-root -x MASTER_ADDR=127.0.0.1 -x "MASTER_PORT=$((20000 + RANDOM % 20000))")
fi

# fusekit-dp's rendezvous listens on MASTER_PORT + 1 under torchrun, which another socket of the
# machine may hold; a port the kernel reports free, taken per run, avoids that (unless the caller
# set FUSEKIT_RENDEZVOUS_PORT).
fixed_port="${FUSEKIT_RENDEZVOUS_PORT:-}"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null
}
for n in "${counts[@]}"; do
  port="${fixed_port:-$(free_port)}"
  if [ -n "$port" ]; then export FUSEKIT_RENDEZVOUS_PORT=$port; fi
  if [ "$gpus" -lt "$n" ]; then
    summary+=("$n ranks: skipped ($gpus GPU(s) present)")
    continue
  fi
  if [ ${#launcher[@]} = 0 ]; then
    summary+=("$n ranks: skipped (neither torchrun nor mpirun found)")
    continue
  fi
  log="$OUT/dp_collective_test-$n-ranks.log"
  start=$SECONDS
  if [ "${launcher[0]}" = mpirun ]; then
    command=("${launcher[@]}" -np "$n" "$program" --gtest_brief=1)
  else
    command=("${launcher[@]}" "--nproc-per-node=$n" "$program" --gtest_brief=1)
  fi
  echo "dp-check: ${command[*]}"
  timeout --kill-after=20 "$timeout_s" "${command[@]}" >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || failed_any=1
  ranks_passed=$(plain "$log" | grep -cE '^\[  PASSED  \] [0-9]+ test')
  summary+=("dp_collective_test, $n ranks: rc $rc in $((SECONDS - start)) s: $ranks_passed of $n ranks passed, $(cases_of "$log")")
  grep -E 'Failure|FAILED|Expected|Which is|error|dp_collective_test: rank' "$log" | head -30
  tables+=("$(tables_of "$log")")
done

echo
echo "dp-check summary"
for line in "${summary[@]}"; do echo "  $line"; done
for table in "${tables[@]}"; do
  [ -n "$table" ] && printf '%s\n' "$table"
done
echo "logs: $OUT"
exit $failed_any
