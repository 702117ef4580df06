#include "suites/peers.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "suites/interrupt.h"
#include "suites/recorded_command.h"

namespace fusekit::suites {
namespace {

// A JSON string: quotes, backslashes and control characters escaped.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The shortest text that reads back to the same double (an integral byte count prints as one).
std::string number(double value) {
  if (!std::isfinite(value)) throw std::logic_error("a case's bytes or flops are not finite");
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, value).ptr);
}

// Reads one results line: a JSON object whose values are strings or arrays of numbers. Throws
// std::runtime_error with what is wrong (the caller adds where).
class ResultLineReader {
 public:
  explicit ResultLineReader(std::string_view text) : text_(text) {}

  PeerResult read() {
    PeerResult result;
    bool has_name = false, has_variant = false, has_samples = false, has_metrics = false;
    expect('{', "a JSON object");
    if (!consume('}')) {
      do {
        const std::string key = read_string("a field name");
        expect(':', "':' after \"" + key + "\"");
        if (key == "name" || key == "variant") {
          bool& seen = key == "name" ? has_name : has_variant;
          if (seen) throw std::runtime_error("\"" + key + "\" given twice");
          seen = true;
          (key == "name" ? result.name : result.variant) = read_string("\"" + key + "\" as a string");
        } else if (key == "samples_ns") {
          if (has_samples) throw std::runtime_error("\"samples_ns\" given twice");
          has_samples = true;
          result.samples_ns = read_numbers();
        } else if (key == "metrics") {
          if (has_metrics) throw std::runtime_error("\"metrics\" given twice");
          has_metrics = true;
          result.metrics = read_metrics();
        } else {
          throw std::runtime_error("unknown field \"" + key + "\" (expected name, variant, samples_ns, metrics)");
        }
      } while (consume(','));
      expect('}', "',' or '}'");
    }
    skip_space();
    if (position_ != text_.size()) throw std::runtime_error("text after the object");
    if (!has_name) throw std::runtime_error("no \"name\"");
    if (!has_variant) throw std::runtime_error("no \"variant\"");
    if (!has_samples) throw std::runtime_error("no \"samples_ns\"");
    return result;
  }

 private:
  void skip_space() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t' ||
                                        text_[position_] == '\r' || text_[position_] == '\n')) {
      ++position_;
    }
  }

  bool consume(char c) {
    skip_space();
    if (position_ < text_.size() && text_[position_] == c) {
      ++position_;
      return true;
    }
    return false;
  }

  void expect(char c, const std::string& what) {
    if (!consume(c)) throw std::runtime_error("expected " + what + " at column " + std::to_string(position_ + 1));
  }

  std::string read_string(const std::string& what) {
    expect('"', what);
    std::string out;
    while (position_ < text_.size()) {
      const char c = text_[position_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (position_ >= text_.size()) break;
      const char e = text_[position_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          // Case names are ASCII; a \u escape is kept only for code points below 0x80.
          unsigned code = 0;
          const char* begin = text_.data() + position_;
          const auto [end, error] =
              std::from_chars(begin, begin + std::min<size_t>(4, text_.size() - position_), code, 16);
          if (error != std::errc() || end != begin + 4 || code >= 0x80) {
            throw std::runtime_error("unsupported \\u escape in a string");
          }
          position_ += 4;
          out += static_cast<char>(code);
          break;
        }
        default:
          throw std::runtime_error(std::string("bad escape \\") + e + " in a string");
      }
    }
    throw std::runtime_error("unterminated string");
  }

  // One JSON number; NaN, Infinity and -Infinity (as Python's json writes them) are read too, so
  // that the checks name them. `what` names it in the error.
  double read_number(const std::string& what) {
    skip_space();
    const size_t start = position_;
    while (position_ < text_.size() && std::strchr("+-.0123456789eEINaftiny", text_[position_]) != nullptr &&
           text_[position_] != '\0') {
      ++position_;
    }
    const std::string_view token = text_.substr(start, position_ - start);
    double value = 0;
    if (token == "NaN") {
      value = std::numeric_limits<double>::quiet_NaN();
    } else if (token == "Infinity" || token == "-Infinity") {
      value = token[0] == '-' ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    } else {
      const auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), value);
      if (token.empty() || error != std::errc() || end != token.data() + token.size()) {
        throw std::runtime_error(what + " is not a number");
      }
    }
    return value;
  }

  // A JSON array of numbers.
  std::vector<double> read_numbers() {
    expect('[', "\"samples_ns\" as an array of numbers");
    std::vector<double> out;
    if (consume(']')) return out;
    do {
      out.push_back(read_number("samples_ns[" + std::to_string(out.size()) + "]"));
    } while (consume(','));
    expect(']', "',' or ']' in \"samples_ns\"");
    return out;
  }

  // A JSON object of numbers: {"peak_memory_bytes": 123}.
  std::vector<store::CaseMetric> read_metrics() {
    expect('{', "\"metrics\" as an object of numbers");
    std::vector<store::CaseMetric> out;
    if (consume('}')) return out;
    do {
      store::CaseMetric m;
      m.name = read_string("a metric name");
      expect(':', "':' after \"" + m.name + "\"");
      m.value = read_number("metrics." + m.name);
      out.push_back(std::move(m));
    } while (consume(','));
    expect('}', "',' or '}' in \"metrics\"");
    return out;
  }

  std::string_view text_;
  size_t position_ = 0;
};

std::unordered_map<std::string, const ListedCase*> by_name(const std::vector<ListedCase>& cases) {
  std::unordered_map<std::string, const ListedCase*> out;
  for (const ListedCase& c : cases) out.emplace(c.info.name, &c);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string case_listing_json(const std::vector<ListedCase>& cases) {
  std::string out = "[";
  for (size_t i = 0; i < cases.size(); ++i) {
    const store::CaseInfo& info = cases[i].info;
    out += i == 0 ? "\n" : ",\n";
    out += "{\"name\": " + quoted(info.name) + ", \"op\": " + quoted(info.op) + ", \"shape\": " + quoted(info.shape) +
           ", \"dtype\": " + quoted(info.dtype) + ", \"direction\": " + quoted(cases[i].backward ? "fwd+bwd" : "fwd") +
           ", \"bytes\": " + number(info.bytes) + ", \"flops\": " + number(info.flops) + "}";
  }
  return out + "\n]\n";
}

std::vector<PeerResult> parse_peer_results(const std::string& text, const std::vector<ListedCase>& cases,
                                           const std::string& source) {
  const auto listed = by_name(cases);
  std::map<std::pair<std::string, std::string>, size_t> first_line;  // (name, variant) -> line
  std::vector<PeerResult> results;
  size_t line_number = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      PeerResult r = ResultLineReader(line).read();
      if (listed.count(r.name) == 0) throw std::runtime_error("case \"" + r.name + "\" is not one of the listed cases");
      if (r.variant.rfind("peer:", 0) != 0 || r.variant.size() == 5) {
        throw std::runtime_error("variant \"" + r.variant + "\" does not name a peer (peer:<name>)");
      }
      if (r.samples_ns.empty()) throw std::runtime_error("no samples");
      for (size_t i = 0; i < r.metrics.size(); ++i) {
        const store::CaseMetric& m = r.metrics[i];
        if (m.name.empty()) throw std::runtime_error("a metric without a name");
        if (!std::isfinite(m.value)) throw std::runtime_error("metrics." + m.name + " is not finite");
        for (size_t j = 0; j < i; ++j) {
          if (r.metrics[j].name == m.name) throw std::runtime_error("metrics." + m.name + " given twice");
        }
      }
      for (size_t i = 0; i < r.samples_ns.size(); ++i) {
        if (!std::isfinite(r.samples_ns[i]) || !(r.samples_ns[i] > 0)) {
          throw std::runtime_error("samples_ns[" + std::to_string(i) + "] = " + std::to_string(r.samples_ns[i]) +
                                   " is not a finite positive number");
        }
      }
      const auto [it, added] = first_line.emplace(std::make_pair(r.name, r.variant), line_number);
      if (!added) {
        throw std::runtime_error("\"" + r.name + "\" [" + r.variant + "] was given on line " +
                                 std::to_string(it->second) + " already");
      }
      results.push_back(std::move(r));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(source + " line " + std::to_string(line_number) + ": " + e.what());
    }
  }
  return results;
}

void record_peer_results(store::Store& store, int64_t run, const std::vector<PeerResult>& results,
                         const std::vector<ListedCase>& cases) {
  const auto listed = by_name(cases);
  for (const PeerResult& r : results) {
    const auto it = listed.find(r.name);
    if (it == listed.end()) throw std::invalid_argument("peer result for a case not listed: " + r.name);
    store::CaseInfo info = it->second->info;
    info.variant = r.variant;
    store.add_case(run, info, r.samples_ns, r.metrics);
  }
}

PeerFiles::PeerFiles(const std::vector<ListedCase>& cases) : cases_(cases) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern = std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/fusekit-peers-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot make a temporary folder for the peers (" + pattern + "): " + std::strerror(errno));
  }
  folder_ = pattern;
  cases_path_ = folder_ + "/cases.json";
  results_path_ = folder_ + "/results.jsonl";
  std::ofstream out(cases_path_, std::ios::binary | std::ios::trunc);
  out << case_listing_json(cases_);
  if (!out.flush()) {
    const std::string reason = std::strerror(errno);
    std::remove(cases_path_.c_str());
    rmdir(folder_.c_str());
    throw std::runtime_error(cases_path_ + ": cannot write: " + reason);
  }
}

PeerFiles::~PeerFiles() {
  std::remove(cases_path_.c_str());
  std::remove(results_path_.c_str());
  rmdir(folder_.c_str());
}

size_t PeerFiles::record_results(store::Store& store, int64_t run, bool script_failed) const {
  try {
    if (access(results_path_.c_str(), F_OK) != 0) throw std::runtime_error("the peers script wrote no results file");
    const std::vector<PeerResult> results = parse_peer_results(read_file(results_path_), cases_, "peer results");
    record_peer_results(store, run, results, cases_);
    return results.size();
  } catch (const std::runtime_error& e) {
    if (!script_failed) throw;
    std::fprintf(stderr, "fusekit: warning: no peer results recorded: %s\n", e.what());
    return 0;
  }
}

void run_peers(store::Store& store, int64_t run, const std::string& db, const PeersOptions& o) {
  const PeerFiles files(list_ops_cases(o.cases));
  std::fprintf(stderr, "fusekit: timing the peers: python3 %s\n", o.script.c_str());
  std::vector<std::string> peer_args = {"python3",     o.script,
                                        "--cases",     files.cases_path(),
                                        "--reps",      std::to_string(o.repetitions),
                                        "--warmup",    std::to_string(o.warmup),
                                        "--warmup-ms", std::to_string(o.warmup_ms),
                                        "--sample-us", std::to_string(o.sample_us)};
  std::vector<std::string> timed_args = peer_args;
  timed_args.insert(timed_args.end(), {"--results", files.results_path()});
  int code = run_recorded_command(db, run, timed_args, 1000, false);
  const size_t recorded = files.record_results(store, run, code != 0);  // kept if the script failed later
  std::fprintf(stderr, "fusekit: recorded %zu peer results\n", recorded);
  throw_if_interrupted();  // the signal went on to the script; what it had measured is recorded
  // Traced too where some cases failed (the script runs the others and exits 1 at the end): the
  // peers that were timed get their kernels; the run still ends failed.
  if (code == 0 || recorded > 0) {
    std::fprintf(stderr, "fusekit: tracing the peers: python3 %s --traced-only\n", o.script.c_str());
    peer_args.push_back("--traced-only");
    const int traced = run_recorded_command(db, run, peer_args, 1000, true);
    throw_if_interrupted();
    if (code == 0) code = traced;
  }
  if (code != 0) throw std::runtime_error("the peers script failed with exit code " + std::to_string(code));
}

}  // namespace fusekit::suites
