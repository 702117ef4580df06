// Temporary folders and file checks for tests, with POSIX calls only. Test programs that link
// libtorch must not call std::filesystem: libtorch.so (PyTorch 2.11) exports its own copies of
// libstdc++'s filesystem functions, and calls bound to them jumped to address 0 on the GPU machine
// (std::filesystem::remove_all, by cuda-gdb's backtrace).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fusekit::test_support {

inline bool path_exists(const std::string& path) {
  struct stat s;
  return ::stat(path.c_str(), &s) == 0;
}

// The folder part of a path ("a/b/c" -> "a/b"; "c" -> ".").
inline std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Removes a file or a folder with everything in it; missing is not an error.
inline void remove_tree(const std::string& path) {
  if (!path_exists(path)) return;
  auto remove_entry = [](const char* entry, const struct stat*, int, struct FTW*) {
    std::remove(entry);  // a file, or a folder already emptied (FTW_DEPTH: contents first)
    return 0;
  };
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// A new folder under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    if (!::mkdtemp(name.data())) throw std::runtime_error("cannot make a temporary folder from " + pattern);
    path_ = name.data();
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `command` through the shell: its exit status (-1 where it did not exit) and what it printed
// on standard output and standard error.
inline std::pair<int, std::string> run_command(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace fusekit::test_support
