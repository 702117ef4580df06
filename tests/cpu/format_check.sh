#!/usr/bin/env bash
# The formatter check (house rule 11): every C++ and CUDA source is as clang-format, with the
# repository's .clang-format, would write it. Prints the files that differ.
set -u
CLANG_FORMAT="$1"
cd "$2" || exit 1
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' 2>/dev/null)
[ ${#files[@]} -gt 0 ] || mapfile -t files < <(find . -path ./build -prune -o -path ./.deps -prune -o \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
bad=0
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (run: clang-format -i $f)"
    bad=$((bad + 1))
  fi
done
echo "format_check: $((${#files[@]} - bad)) passed, $bad failed"
[ "$bad" = 0 ]
