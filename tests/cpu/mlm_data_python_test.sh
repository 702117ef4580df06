#!/usr/bin/env bash
# The Python port of the synthetic MLM generator (scripts/peers/mlm_data.py) against the C++ one:
# batches written by mlm_batches_write, regenerated in Python, compared value by value.
# Usage: mlm_data_python_test.sh PYTHON MLM_BATCHES_WRITE SCRIPT
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$2" "$dir/batches.safetensors"
"$1" "$3" --check "$dir/batches.safetensors"
"$1" "$3" --check "$dir/batches.safetensors.512"
"$1" "$3" --check "$dir/batches.safetensors.echo"
