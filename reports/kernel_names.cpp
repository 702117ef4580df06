#include "reports/kernel_names.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string_view>

#include "profiler/records.h"

namespace fusekit::reports {
namespace {

constexpr std::string_view kAnonymous = "(anonymous namespace)::";

std::string without_anonymous(std::string s) {
  for (size_t at; (at = s.find(kAnonymous)) != std::string::npos;) s.erase(at, kAnonymous.size());
  return s;
}

bool identifier_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// The text between the '<' and '>' that close the kernel's own name (before its parameter list), or "".
std::string template_arguments(const std::string& name) {
  const std::string s = without_anonymous(name);
  int depth = 0;
  size_t end = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') {
      ++depth;
    } else if (s[i] == '>') {
      depth = depth > 0 ? depth - 1 : 0;
    } else if (s[i] == '(' && depth == 0 && i > 0) {
      end = i;
      break;
    }
  }
  while (end > 0 && s[end - 1] == ' ') --end;
  if (end == 0 || s[end - 1] != '>') return "";
  depth = 0;
  for (size_t i = end; i-- > 0;) {
    if (s[i] == '>') {
      ++depth;
    } else if (s[i] == '<' && --depth == 0) {
      return s.substr(i + 1, end - 1 - (i + 1));
    }
  }
  return "";
}

// "(ns::Type)12" at `at`: the cast as "(Type)12", and where it ends; nullopt-like empty word otherwise.
std::string cast_at(std::string_view s, size_t at, size_t& end) {
  size_t i = at + 1;
  std::string last;
  while (true) {
    if (i >= s.size() || !identifier_start(s[i])) return "";
    const size_t begin = i;
    while (i < s.size() && identifier_char(s[i])) ++i;
    last = std::string(s.substr(begin, i - begin));
    if (s.substr(i, 2) != "::") break;
    i += 2;
  }
  if (i >= s.size() || s[i] != ')') return "";
  ++i;
  const size_t number = i;
  if (i < s.size() && s[i] == '-') ++i;
  if (i >= s.size() || !digit(s[i])) return "";
  while (i < s.size() && digit(s[i])) ++i;
  end = i;
  return "(" + last + ")" + std::string(s.substr(number, i - number));
}

const std::set<std::string_view>& noise_words() {
  static const std::set<std::string_view> words = {"void",  "const", "volatile", "operator",  "lambda",   "struct",
                                                   "class", "enum",  "typename", "anonymous", "namespace"};
  return words;
}

// A name with every "scope::" qualifier and "(anonymous namespace)::" removed, and no leading "void ".
std::string without_namespaces(const std::string& name) {
  const std::string s = without_anonymous(name);
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (identifier_start(s[i]) && (i == 0 || !identifier_char(s[i - 1]))) {
      size_t j = i;
      while (j < s.size() && identifier_char(s[j])) ++j;
      if (s.compare(j, 2, "::") == 0) {
        i = j + 2;  // a qualifier: drop it
        continue;
      }
      out.append(s, i, j - i);
      i = j;
      continue;
    }
    out += s[i++];
  }
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  return out;
}

std::string render(const std::string& base, const std::vector<std::string>& words, const std::vector<size_t>& at,
                   size_t count) {
  std::string out = base + "<";
  bool first = true;
  for (size_t i = 0; i < count; ++i) {
    if (at[i] >= words.size()) continue;
    out += (first ? "" : ", ") + words[at[i]];
    first = false;
  }
  return out + ">";
}

bool all_distinct(const std::vector<std::string>& labels) {
  return std::set<std::string>(labels.begin(), labels.end()).size() == labels.size();
}

// The words of a group's names.
struct GroupWords {
  std::vector<std::vector<std::string>> words;
  size_t longest = 0;

  GroupWords(const std::vector<std::string>& names, bool ordinals) {
    for (const std::string& n : names) {
      words.push_back(template_argument_words(n, ordinals));
      longest = std::max(longest, words.back().size());
    }
  }
  std::string word(size_t m, size_t i) const { return i < words[m].size() ? words[m][i] : std::string("\x01"); }
  // Name m's label: its words, from the first position on, at each position where some name that matched it
  // so far differs, until none is left; "" where another name matches it at every position.
  std::string label(const std::string& base, size_t m) const {
    std::vector<size_t> rivals;
    for (size_t n = 0; n < words.size(); ++n)
      if (n != m) rivals.push_back(n);
    std::vector<size_t> shown;
    for (size_t i = 0; i < longest && !rivals.empty(); ++i) {
      std::vector<size_t> same;
      for (size_t n : rivals)
        if (word(n, i) == word(m, i)) same.push_back(n);
      if (same.size() == rivals.size()) continue;
      shown.push_back(i);
      rivals = std::move(same);
    }
    return rivals.empty() ? render(base, words[m], shown, shown.size()) : "";
  }
};

// Labels for names that share the short name `base` (distinct names, two or more). A name whose words
// match another's at every position (lambdas that differ only in their ordinal) is told apart by its words
// with the lambdas' ordinals.
std::vector<std::string> group_labels(const std::string& base, const std::vector<std::string>& names) {
  const GroupWords plain(names, false), with_ordinals(names, true);
  std::vector<std::string> labels;
  for (size_t m = 0; m < names.size(); ++m) {
    std::string label = plain.label(base, m);
    if (label.empty()) label = with_ordinals.label(base, m);
    if (label.empty()) break;
    labels.push_back(std::move(label));
  }
  if (labels.size() == names.size() && all_distinct(labels)) return labels;
  labels.clear();
  for (const std::string& n : names) labels.push_back(without_namespaces(n));
  return all_distinct(labels) ? labels : names;
}

}  // namespace

std::vector<std::string> template_argument_words(const std::string& name, bool lambda_ordinals) {
  const std::string args = template_arguments(name);
  const std::string_view s = args;
  std::vector<std::string> words;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '(') {
      size_t end = 0;
      std::string cast = cast_at(s, i, end);
      if (!cast.empty()) {
        words.push_back(std::move(cast));
        i = end;
        continue;
      }
      ++i;
    } else if (identifier_start(c)) {
      size_t j = i;
      while (j < s.size() && identifier_char(s[j])) ++j;
      std::string word(s.substr(i, j - i));
      size_t next = j;
      while (next < s.size() && s[next] == ' ') ++next;
      const bool qualifier = s.substr(next, 2) == "::";
      if (!qualifier && !noise_words().count(word)) words.push_back(std::move(word));
      i = j;
    } else if (digit(c) || (c == '-' && i + 1 < s.size() && digit(s[i + 1]))) {
      const bool ordinal = i > 0 && s[i - 1] == '#';
      size_t j = i + 1;
      while (j < s.size() && digit(s[j])) ++j;
      std::string number(s.substr(i, j - i));
      while (j < s.size() && (s[j] == 'u' || s[j] == 'U' || s[j] == 'l' || s[j] == 'L')) ++j;
      if (!ordinal)
        words.push_back(std::move(number));
      else if (lambda_ordinals)
        words.push_back("lambda#" + number);
      i = j;
    } else {
      ++i;
    }
  }
  return words;
}

std::vector<std::string> distinct_short_names(const std::vector<std::string>& names) {
  // The distinct names by short name.
  std::map<std::string, std::vector<std::string>> groups;
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (seen.insert(n).second) groups[profiler::short_kernel_name(n)].push_back(n);
  }
  std::map<std::string, std::string> label;
  for (const auto& [base, members] : groups) {
    if (members.size() == 1) {
      label[members[0]] = base;
      continue;
    }
    const std::vector<std::string> labels = group_labels(base, members);
    for (size_t i = 0; i < members.size(); ++i) label[members[i]] = labels[i];
  }
  // A label that some other name's label happens to equal (a short name that looks like another's summary)
  // falls back to the whole name, which is distinct.
  for (bool changed = true; changed;) {
    changed = false;
    std::map<std::string, int> uses;
    for (const auto& [name, l] : label) ++uses[l];
    for (auto& [name, l] : label) {
      if (uses[l] > 1 && l != name) {
        l = name;
        changed = true;
      }
    }
  }
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const std::string& n : names) out.push_back(label[n]);
  return out;
}

}  // namespace fusekit::reports
