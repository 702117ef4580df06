// The include graph against the layers of the design: kernels | profiler -> models -> baselines ->
// store -> suites -> reports -> cli (dp on kernels, profiler and models, torch_ops on kernels; baselines/
// includes kernels/ for the storage types only). Every C++ and CUDA source under a
// layer's folder is scanned for `#include "<folder>/..."`; a folder that includes one it may not is
// reported with its file, line and include. FUSEKIT_SOURCE_DIR names the tree to scan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Each layer's folder and the folders it may include (itself among them).
const std::map<std::string, std::set<std::string>>& allowed_includes() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"kernels", {"kernels"}},
      {"baselines", {"baselines", "models", "kernels", "profiler"}},
      {"profiler", {"profiler"}},
      {"store", {"store", "profiler"}},
      {"suites", {"suites", "kernels", "baselines", "profiler", "store", "models"}},
      {"reports", {"reports", "store", "profiler"}},
      {"cli", {"cli", "kernels", "baselines", "profiler", "store", "suites", "reports", "models", "dp", "torch_ops"}},
      {"models", {"models", "kernels", "profiler"}},
      {"dp", {"dp", "kernels", "profiler", "models"}},
      {"torch_ops", {"torch_ops", "kernels"}},
  };
  return allowed;
}

// The folder named by the first component of a quoted include ("store/store.h" -> "store"), if it
// is a layer's folder; includes of other headers (CUDA, SQLite, a file beside the includer) are no
// layer's business.
std::optional<std::string> included_layer(const std::string& line) {
  static const std::regex include(R"(^\s*#\s*include\s*"([A-Za-z0-9_]+)/[^"]*")");
  std::smatch match;
  if (!std::regex_search(line, match, include)) return std::nullopt;
  const std::string folder = match[1];
  if (!allowed_includes().count(folder)) return std::nullopt;
  return folder;
}

// The violation of one source line of a file in `folder`, or nothing.
std::optional<std::string> check_line(const std::string& folder, const std::string& file, int line_number,
                                      const std::string& line) {
  const std::optional<std::string> layer = included_layer(line);
  if (!layer) return std::nullopt;
  const std::set<std::string>& allowed = allowed_includes().at(folder);
  if (allowed.count(*layer)) return std::nullopt;
  std::string may;
  for (const std::string& a : allowed) may += (may.empty() ? "" : ", ") + a;
  return file + ":" + std::to_string(line_number) + ": " + line + " (" + folder + "/ may include only " + may + ")";
}

bool is_source(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".h" || ext == ".cuh" || ext == ".cpp" || ext == ".cu";
}

struct Scan {
  size_t files = 0;
  std::vector<std::string> violations;
};

Scan scan_tree(const fs::path& root) {
  Scan scan;
  for (const auto& [folder, allowed] : allowed_includes()) {
    const fs::path dir = root / folder;
    if (!fs::is_directory(dir)) continue;  // models/, dp/, torch_ops/ may not exist yet
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      ++scan.files;
      std::ifstream in(entry.path());
      std::string line;
      int number = 0;
      const std::string name = fs::relative(entry.path(), root).generic_string();
      while (std::getline(in, line)) {
        ++number;
        if (auto violation = check_line(folder, name, number, line)) scan.violations.push_back(*violation);
      }
    }
  }
  return scan;
}

TEST(Layering, CheckLineAllowsOwnAndLowerLayers) {
  EXPECT_FALSE(check_line("store", "store/store.h", 1, "#include \"profiler/records.h\""));
  EXPECT_FALSE(check_line("suites", "suites/runner.h", 2, "#include \"store/store.h\""));
  EXPECT_FALSE(check_line("reports", "reports/gate.cpp", 3, "  #  include \"reports/gate.h\""));
  EXPECT_FALSE(check_line("cli", "cli/commands.cpp", 4, "#include \"suites/runner.h\""));
  EXPECT_FALSE(check_line("dp", "dp/select.cu", 5, "#include \"models/bert.h\""));
  // Not a layer's header: system, library and same-folder includes.
  EXPECT_FALSE(check_line("kernels", "kernels/a.cu", 6, "#include <cuda_runtime.h>"));
  EXPECT_FALSE(check_line("profiler", "profiler/a.cpp", 7, "#include \"cupti_tracer.h\""));
  EXPECT_FALSE(check_line("store", "store/a.cpp", 8, "#include \"sqlite/sqlite3.h\""));
}

TEST(Layering, CheckLineRejectsAHigherLayer) {
  const auto upward = check_line("profiler", "profiler/injection.cpp", 21, "#include \"store/store.h\"");
  ASSERT_TRUE(upward);
  EXPECT_EQ(*upward, "profiler/injection.cpp:21: #include \"store/store.h\" (profiler/ may include only profiler)");
  EXPECT_TRUE(check_line("store", "store/store.h", 3, "#include \"reports/run_report.h\""));
  EXPECT_TRUE(check_line("reports", "reports/x.cpp", 4, "#include \"suites/runner.h\""));
  EXPECT_TRUE(check_line("suites", "suites/x.cpp", 5, "#include \"reports/terminal.h\""));
  EXPECT_TRUE(check_line("kernels", "kernels/x.cu", 6, "#include \"profiler/range.h\""));
  EXPECT_TRUE(check_line("torch_ops", "torch_ops/x.cpp", 7, "#include \"baselines/layernorm.h\""));
  EXPECT_TRUE(check_line("models", "models/x.cu", 8, "#include \"dp/collectives.h\""));
}

TEST(Layering, EveryIncludeRunsDownTheLayers) {
  const Scan scan = scan_tree(FUSEKIT_SOURCE_DIR);
  // The tree was found: a wrong source directory must not pass as a clean graph.
  EXPECT_GT(scan.files, 50u);
  for (const std::string& v : scan.violations) ADD_FAILURE() << v;
}

}  // namespace
