#!/usr/bin/env bash
# scripts/peers/bert_reference.py on bad input: one line on standard error and exit status 1 (2 for a
# usage error). The script checks its input before it imports torch, so this runs on any machine.
# Usage: bert_reference_errors_test.sh PYTHON MLM_BATCHES_WRITE SCRIPT
set -u
python=$1
script=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$2" "$dir/batches.safetensors" || exit 1  # batches 3 to 6, sequences of 48 tokens
bad=0

# expect STATUS PATTERN ARGUMENT...: the exit status, and one line on standard error that matches.
expect() {
  local status=$1 pattern=$2 error rc
  shift 2
  error=$("$python" "$script" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" != "$status" ] || [ "$(printf '%s\n' "$error" | grep -c .)" != 1 ] || ! grep -qF -- "$pattern" <<<"$error"; then
    echo "FAIL: exit $rc (expected $status), expected one line with '$pattern', got:"
    printf '%s\n' "$error"
    bad=$((bad + 1))
  else
    echo "ok: $error"
  fi
}

batches=(--batches "$dir/batches.safetensors" --batch-index 3)
weights=(--weights "$dir/weights.safetensors")
output=(--output "$dir/reference.safetensors")
sizes=(--layers 2 --hidden 128 --heads 2 --intermediate 512 --vocab 30522 --max-positions 512)
expect 1 "weights.safetensors: no such file" "${weights[@]}" "${batches[@]}" "${sizes[@]}" "${output[@]}"
expect 1 "none.safetensors: No such file or directory" "${weights[@]}" --batches "$dir/none.safetensors" \
  "${sizes[@]}" "${output[@]}"
expect 1 "not a batches file" "${weights[@]}" --batches "$script" "${sizes[@]}" "${output[@]}"
expect 1 "no batch 0 (it holds [3, 4, 5, 6])" "${weights[@]}" --batches "$dir/batches.safetensors" "${sizes[@]}" \
  "${output[@]}"
expect 1 "--hidden 128 is not a multiple of --heads 3" "${weights[@]}" "${batches[@]}" "${sizes[@]}" --heads 3 \
  "${output[@]}"
expect 1 "outside [0, 300)" "${weights[@]}" "${batches[@]}" "${sizes[@]}" --vocab 300 "${output[@]}"
expect 1 "sequences of 48 tokens, --max-positions is 32" "${weights[@]}" "${batches[@]}" "${sizes[@]}" \
  --max-positions 32 "${output[@]}"
expect 2 "the following arguments are required: --output" "${weights[@]}" "${batches[@]}" "${sizes[@]}"

echo "bert_reference_errors: $bad failed"
[ "$bad" = 0 ]
