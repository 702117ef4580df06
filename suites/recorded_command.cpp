#include "suites/recorded_command.h"

#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "profiler/cupti_tracer.h"
#include "suites/interrupt.h"

namespace fusekit::suites {
namespace {

std::string directory_of_executable() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

}  // namespace

int run_recorded_command(const std::string& db, int64_t run, const std::vector<std::string>& command, int flush_ms,
                         bool traced) {
  const char* override_path = std::getenv("FUSEKIT_INJECT_LIBRARY");
  const std::string inject = override_path ? override_path : directory_of_executable() + "/libfusekit_inject.so";
  const std::string cupti = profiler::cupti_library_path();
  if (traced && access(inject.c_str(), R_OK) != 0) throw std::runtime_error("injection library not found: " + inject);
  if (traced && cupti.empty()) throw std::runtime_error("the CUPTI library is not loaded; cannot trace NVTX ranges");
  // Everything the child needs is built here, before it exists: between fork and exec only
  // async-signal-safe calls are allowed, so the child is started with posix_spawnp.
  std::vector<std::string> overrides = {"FUSEKIT_TRACE_DB=" + db, "FUSEKIT_TRACE_RUN=" + std::to_string(run),
                                        "FUSEKIT_TRACE_FLUSH_MS=" + std::to_string(flush_ms)};
  if (traced) {
    overrides.push_back("CUDA_INJECTION64_PATH=" + inject);
    overrides.push_back("NVTX_INJECTION64_PATH=" + cupti);
  }
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& o : overrides) replaced = replaced || o.compare(0, key.size(), key) == 0;
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), overrides.begin(), overrides.end());
  std::vector<char*> envp, argv;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  const int rc = posix_spawnp(&child, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) throw CommandNotStarted("cannot run '" + args.front() + "': " + std::strerror(rc));
  // A SIGINT or SIGTERM caught while it runs (suites/interrupt.h) is passed on to it.
  set_interrupt_child(child);
  // Waited for without reaping, so that the pid cannot be reused while a signal may still be passed
  // on to it; then forgotten, then reaped.
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  set_interrupt_child(0);
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno == EINTR) continue;
    // Reaped elsewhere (SIGCHLD ignored): the status waitid saw, if it saw one.
    if (info.si_pid == 0) return 1;
    return info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace fusekit::suites
