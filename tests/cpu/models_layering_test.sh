#!/usr/bin/env bash
# The layer rule of models/ (DESIGN.md): its files include only models/, kernels/ and profiler/ headers of the
# project, and the host library's files (those models/CMakeLists.txt lists for fusekit_models_host,
# with their headers) include no CUDA, cuBLAS or libtorch header. Nothing in kernels/ includes models/.
set -u
cd "$1" || exit 1
bad=0
while IFS= read -r line; do
  echo "models/ includes a header of another layer: $line"
  bad=$((bad + 1))
done < <(grep -HnE '^\s*#\s*include\s+"' models/*.h models/*.cpp models/*.cu models/*.cuh 2>/dev/null |
  grep -vE '#\s*include\s+"(models|kernels|profiler)/')
host_sources=$(sed -n '/add_library(fusekit_models_host/,/)/p' models/CMakeLists.txt | grep -oE '[a-z_]+\.cpp')
for source in $host_sources; do
  for file in "models/$source" "models/${source%.cpp}.h"; do
    [ -e "$file" ] || continue
    while IFS= read -r line; do
      echo "the host library includes a GPU or libtorch header: $line"
      bad=$((bad + 1))
    done < <(grep -HnE '^\s*#\s*include\s+[<"](cuda|cublas|cuda_runtime|torch/|ATen/|c10/|kernels/[a-z_]+\.cuh)' "$file")
    # A kernels/ header other than dtype.h pulls in CUDA's runtime header.
    while IFS= read -r line; do
      echo "the host library includes a kernels/ header that needs CUDA: $line"
      bad=$((bad + 1))
    done < <(grep -HnE '^\s*#\s*include\s+"kernels/' "$file" | grep -v '"kernels/dtype.h"')
  done
done
while IFS= read -r line; do
  echo "kernels/ includes models/: $line"
  bad=$((bad + 1))
done < <(grep -rHnE '^\s*#\s*include\s+"models/' kernels 2>/dev/null)
echo "models_layering: $bad violations"
[ "$bad" = 0 ]
