# Finds fusekit's dependencies: the system's, or those that scripts/device-deps.sh unpacked into .deps/.
set(_deps_lib "${FUSEKIT_DEPS_DIR}/usr/lib/x86_64-linux-gnu")
set(_deps_include "${FUSEKIT_DEPS_DIR}/usr/include")

# SQLite
find_path(SQLITE3_INCLUDE_DIR sqlite3.h HINTS "${_deps_include}")
find_library(SQLITE3_LIBRARY NAMES sqlite3 libsqlite3.so.0 HINTS "${_deps_lib}")
if(NOT SQLITE3_INCLUDE_DIR OR NOT SQLITE3_LIBRARY)
  message(FATAL_ERROR "fusekit: SQLite not found (need sqlite3.h and libsqlite3). "
                      "Install libsqlite3-dev, or run scripts/device-deps.sh to unpack it into .deps/")
endif()
add_library(fusekit_sqlite3 INTERFACE)
target_include_directories(fusekit_sqlite3 SYSTEM INTERFACE "${SQLITE3_INCLUDE_DIR}")
target_link_libraries(fusekit_sqlite3 INTERFACE "${SQLITE3_LIBRARY}")

# CLI11 (header only)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS "${_deps_include}")
if(NOT CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "fusekit: CLI11 not found. Install libcli11-dev, or run scripts/device-deps.sh")
endif()
add_library(fusekit_cli11 INTERFACE)
target_include_directories(fusekit_cli11 SYSTEM INTERFACE "${CLI11_INCLUDE_DIR}")

# Chart.js, embedded into the HTML writer so reports fetch nothing when viewed.
find_file(FUSEKIT_CHARTJS chart.min.js
  PATHS "${FUSEKIT_DEPS_DIR}/usr/share/javascript/chart.js" /usr/share/javascript/chart.js NO_DEFAULT_PATH)
if(NOT FUSEKIT_CHARTJS)
  message(FATAL_ERROR "fusekit: chart.min.js not found. Install libjs-chart.js, or run scripts/device-deps.sh")
endif()

# GoogleTest: an installed package, else its sources (Debian's googletest package).
find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_path(GOOGLETEST_SOURCE_DIR googletest/CMakeLists.txt
    PATHS "${FUSEKIT_DEPS_DIR}/usr/src/googletest" /usr/src/googletest NO_DEFAULT_PATH)
  if(NOT GOOGLETEST_SOURCE_DIR)
    message(FATAL_ERROR "fusekit: GoogleTest not found. Install googletest, or run scripts/device-deps.sh")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${GOOGLETEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/googletest" EXCLUDE_FROM_ALL SYSTEM)
  add_library(GTest::gtest ALIAS gtest)
  add_library(GTest::gtest_main ALIAS gtest_main)
endif()

# CUPTI ships with the CUDA toolkit; FindCUDAToolkit knows where (lib64, targets/<arch>/lib or extras/CUPTI).
if(NOT TARGET CUDA::cupti)
  message(FATAL_ERROR "fusekit: CUPTI not found in the CUDA toolkit at ${CUDAToolkit_LIBRARY_ROOT}")
endif()
add_library(fusekit_cupti INTERFACE)
target_link_libraries(fusekit_cupti INTERFACE CUDA::cupti)
