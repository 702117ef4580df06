#!/usr/bin/env bash
# Installs what fusekit needs from Debian packages (where missing), configures and builds.
# Sourced by run.sh and test.sh. Honors BUILD_DIR (default build), CMAKE_ARGS and FUSEKIT_TARGETS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"

need_packages=()
have_header() { [ -e "/usr/include/$1" ] || [ -e "$ROOT/.deps/usr/include/$1" ]; }
have_header sqlite3.h || need_packages+=(libsqlite3-dev)
have_header CLI/CLI.hpp || need_packages+=(libcli11-dev)
[ -e /usr/share/javascript/chart.js/chart.min.js ] || [ -e "$ROOT/.deps/usr/share/javascript/chart.js/chart.min.js" ] ||
  need_packages+=(libjs-chart.js)
[ -e /usr/src/googletest/CMakeLists.txt ] || [ -e "$ROOT/.deps/usr/src/googletest/CMakeLists.txt" ] ||
  [ -e /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] || need_packages+=(googletest libgtest-dev)
command -v ninja >/dev/null || need_packages+=(ninja-build)
command -v cmake >/dev/null || need_packages+=(cmake)
command -v python3 >/dev/null || need_packages+=(python3)
if [ ${#need_packages[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "fusekit setup: installing ${need_packages[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_packages[@]}" >/dev/null
  else
    echo "fusekit setup: missing ${need_packages[*]}: install them, or run scripts/device-deps.sh on a machine with apt" >&2
    exit 1
  fi
fi

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
  [ -x /usr/local/cuda/bin/nvcc ] && export CUDACXX=/usr/local/cuda/bin/nvcc
fi

cmake_args=(-G Ninja -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo)
# libtorch, where PyTorch is installed (the GPU machine): its targets build too.
if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  cmake_args+=("-DCMAKE_PREFIX_PATH=$torch_prefix")
fi
# shellcheck disable=SC2206
cmake_args+=(${CMAKE_ARGS:-})
if ! cmake "${cmake_args[@]}" >"$BUILD_DIR.configure.log" 2>&1; then
  if [ -n "${torch_prefix:-}" ]; then
    # A libtorch that fails to configure must not stop the rest of the build: say so, go on without.
    echo "fusekit setup: configuring with libtorch failed; libtorch targets are left out:"
    grep -m 5 -A 3 "CMake Error" "$BUILD_DIR.configure.log" || tail -n 20 "$BUILD_DIR.configure.log"
    rm -rf "$BUILD_DIR"
    cmake "${cmake_args[@]/-DCMAKE_PREFIX_PATH=*/}" >"$BUILD_DIR.configure.log" 2>&1 || { cat "$BUILD_DIR.configure.log"; exit 1; }
  else
    cat "$BUILD_DIR.configure.log"
    exit 1
  fi
fi
grep 'fusekit:' "$BUILD_DIR.configure.log" || true
# FUSEKIT_TARGETS="fusekit" builds only those targets (a suite run needs only the CLI).
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$(nproc)" ${FUSEKIT_TARGETS:+--target $FUSEKIT_TARGETS} -- -k 0
