#include "profiler/records.h"

#include <cxxabi.h>

#include <cstdlib>
#include <iterator>
#include <memory>

namespace fusekit::profiler {
namespace {

template <class T>
void move_append(std::vector<T>& to, std::vector<T>& from) {
  if (to.empty()) {
    to = std::move(from);
  } else {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  }
  from.clear();
}

}  // namespace

void Trace::append(Trace&& other) {
  move_append(kernels, other.kernels);
  move_append(memcpys, other.memcpys);
  move_append(memsets, other.memsets);
  move_append(api_calls, other.api_calls);
  move_append(ranges, other.ranges);
  dropped_records += other.dropped_records;
  other.dropped_records = 0;
}

std::string demangle(const char* mangled) {
  if (mangled == nullptr) return "";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

std::string short_kernel_name(const std::string& demangled) {
  std::string s = demangled;
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  // Drop the parameter list: the first '(' at template depth 0.
  int depth = 0;
  size_t paren = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '<')
      ++depth;
    else if (c == '>')
      depth = depth > 0 ? depth - 1 : 0;
    else if (c == '(' && depth == 0) {
      paren = i;
      break;
    }
  }
  if (paren != std::string::npos && paren > 0) s.resize(paren);
  // Drop template arguments: everything between a '<' at depth 0 and its '>'.
  std::string no_templates;
  depth = 0;
  for (char c : s) {
    if (c == '<')
      ++depth;
    else if (c == '>')
      depth = depth > 0 ? depth - 1 : 0;
    else if (depth == 0)
      no_templates += c;
  }
  // Drop the return type and namespaces: what follows the last space, then the last "::".
  size_t space = no_templates.find_last_of(' ');
  if (space != std::string::npos) no_templates = no_templates.substr(space + 1);
  size_t scope = no_templates.rfind("::");
  if (scope != std::string::npos) no_templates = no_templates.substr(scope + 2);
  return no_templates.empty() ? demangled : no_templates;
}

}  // namespace fusekit::profiler
