#include "profiler/environment.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>

#ifndef FUSEKIT_SOURCE_DIR
#define FUSEKIT_SOURCE_DIR "."
#endif
#ifndef FUSEKIT_LIBTORCH_VERSION
#define FUSEKIT_LIBTORCH_VERSION ""
#endif
#ifndef FUSEKIT_BUILD_COMMIT
#define FUSEKIT_BUILD_COMMIT ""
#endif

namespace fusekit::profiler {
namespace {

std::string version_string(int v) {
  return v <= 0 ? "" : std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

bool is_commit(const std::string& s) {
  return s.size() == 40 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The first line `command` prints, without its line end ("" if it fails or prints nothing).
std::string first_line_of(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::array<char, 128> buf{};
  std::string out;
  if (pipe && fgets(buf.data(), buf.size(), pipe.get())) out = buf.data();
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// FUSEKIT_GIT_COMMIT if set (a copy of the tree without .git), else the source tree's commit now,
// which may be newer than the configured one, else the configured one. A source tree with changes
// to tracked files that are not committed gets a warning: the commit recorded does not describe
// what was built (a tree copied over an older checkout looks like that too).
std::string git_commit() {
  check_commit_override();
  if (const char* given = std::getenv("FUSEKIT_GIT_COMMIT"); given && *given) return given;
  const std::string git = "git -C '" FUSEKIT_SOURCE_DIR "' ";
  const std::string head = first_line_of(git + "rev-parse HEAD 2>/dev/null");
  if (is_commit(head)) {
    if (!first_line_of(git + "status --porcelain --untracked-files=no 2>/dev/null").empty()) {
      std::fprintf(stderr,
                   "fusekit: warning: the source tree has changes that are not committed; the run records %s, "
                   "which does not describe them (commit them, or set FUSEKIT_GIT_COMMIT)\n",
                   head.c_str());
    }
    return head;
  }
  return is_commit(FUSEKIT_BUILD_COMMIT) ? FUSEKIT_BUILD_COMMIT : "";
}

std::string uuid_string(const cudaUUID_t& uuid) {
  char out[64];
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

// The kernel module's version ("580.159.04"), as nvidia-smi shows it.
std::string kernel_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  std::getline(in, line);
  std::smatch m;
  if (std::regex_search(line, m, std::regex(R"((\d+\.\d+(\.\d+)?))"))) return m[1];
  return "";
}

}  // namespace

std::string gpu_unavailable_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  int driver = 0;
  // Without an NVIDIA driver the runtime reports "driver version is insufficient", which reads as if
  // an upgrade would help: a machine with no driver (version 0) is said to have none.
  if (status == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
    return "no NVIDIA driver is loaded on this machine";
  }
  if (status != cudaSuccess) return cudaGetErrorString(status);
  if (count == 0) return "no CUDA-capable device is detected";
  return "";
}

void check_commit_override() {
  // A short or mistyped id would otherwise be dropped for the tree's own commit, which a copy of
  // the tree may not describe: the run would record the wrong commit.
  const char* given = std::getenv("FUSEKIT_GIT_COMMIT");
  if (given && *given && !is_commit(given)) {
    throw std::invalid_argument(std::string("FUSEKIT_GIT_COMMIT must be a full commit id (40 lowercase hex digits, as "
                                            "`git rev-parse HEAD` prints it), not '") +
                                given + "'");
  }
}

Environment read_environment() {
  Environment env;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) env.host = host;
  env.git_commit = git_commit();
  env.libtorch_version = FUSEKIT_LIBTORCH_VERSION;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) env.runtime_version = version_string(v);
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) {
    env.driver_version = kernel_driver_version();
    env.driver_version += (env.driver_version.empty() ? "CUDA " : " (CUDA ") + version_string(v) +
                          (env.driver_version.empty() ? "" : ")");
  }
  env.gpu_error = gpu_unavailable_reason();
  if (!env.gpu_error.empty()) return env;
  int count = 0;
  cudaGetDeviceCount(&count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    GpuInfo g;
    g.device_id = static_cast<uint32_t>(d);
    g.name = prop.name;
    g.uuid = uuid_string(prop.uuid);
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    g.bus_location = bus;
    g.total_memory = prop.totalGlobalMem;
    g.sm_count = prop.multiProcessorCount;
    g.compute_major = prop.major;
    g.compute_minor = prop.minor;
    g.l2_cache_size = static_cast<uint64_t>(prop.l2CacheSize);
    env.gpus.push_back(g);
  }
  return env;
}

}  // namespace fusekit::profiler
