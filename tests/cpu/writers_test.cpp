// The report writers on a hand-built report whose names hold commas, quotes, pipes, templates and
// "</script>": the CSV reads back cell for cell, the Markdown tables keep their shape, the JSON parses to the
// same values, the HTML embeds Chart.js, fetches nothing and escapes every name, and the Chrome trace holds one
// event per record on the right tracks, timed from the earliest record.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "reports/chartjs.h"
#include "reports/chrome_trace.h"
#include "reports/csv.h"
#include "reports/html.h"
#include "reports/json.h"
#include "reports/markdown.h"
#include "reports/terminal.h"

namespace fusekit::reports {
namespace {

// ---- readers the writers must satisfy

// RFC 4180, strictly: a quote inside an unquoted field or text after a closing quote is an error.
std::vector<std::vector<std::string>> parse_csv(std::string_view text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string cell;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '"') {
      for (++i;; ++i) {
        if (i >= text.size()) throw std::runtime_error("unterminated quoted field");
        if (text[i] == '"' && i + 1 < text.size() && text[i + 1] == '"') {
          cell += '"';
          ++i;
        } else if (text[i] == '"') {
          ++i;
          break;
        } else {
          cell += text[i];
        }
      }
    } else {
      for (; i < text.size() && text[i] != ',' && text[i] != '\n' && text[i] != '\r'; ++i) {
        if (text[i] == '"') throw std::runtime_error("quote in an unquoted field");
        cell += text[i];
      }
    }
    if (i < text.size() && text[i] == ',') {
      row.push_back(std::move(cell));
      cell.clear();
      ++i;
      continue;
    }
    if (text.substr(i, 2) == "\r\n") ++i;
    if (i < text.size() && text[i] != '\n') throw std::runtime_error("text after a closing quote");
    ++i;
    row.push_back(std::move(cell));
    cell.clear();
    rows.push_back(std::move(row));
    row.clear();
  }
  return rows;
}

struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  bool flag = false;
  double value = 0;
  std::string text;
  std::vector<Json> items;        // of an array
  std::vector<std::string> keys;  // of an object, with its values in `items`

  const Json& operator[](std::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return items[i];
    throw std::runtime_error("no member " + std::string(key));
  }
};

// Recursive descent over RFC 8259; anything else throws.
class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}
  Json document() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why + " at offset " + std::to_string(i_)); }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected ") + c);
  }
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  Json value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::object;
      ++i_;
      if (take('}')) return v;
      do {
        space();
        v.keys.push_back(string());
        expect(':');
        v.items.push_back(value());
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::array;
      ++i_;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::string;
      v.text = string();
    } else if (word("true") || word("false")) {
      v.kind = Json::boolean;
      v.flag = c == 't';
    } else if (word("null")) {
      v.kind = Json::null;
    } else {
      v.kind = Json::number;
      v.value = number();
    }
    return v;
  }
  double number() {
    const size_t start = i_;
    const auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      return i_ - from;
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0')
      ++i_;
    else if (digits() == 0)
      fail("bad number");
    if (i_ < s_.size() && s_[i_] == '.' && (++i_, digits() == 0)) fail("bad fraction");
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("bad exponent");
    }
    return std::stod(std::string(s_.substr(start, i_ - start)));
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    const std::string h(s_.substr(i_, 4));
    if (h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail("bad \\u escape");
    i_ += 4;
    return static_cast<unsigned>(std::stoul(h, nullptr, 16));
  }
  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | cp >> 6);
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | cp >> 12);
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | cp >> 18);
      out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
    std::string out;
    for (++i_;; ++i_) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++i_ >= s_.size()) fail("unterminated escape");
      switch (s_[i_]) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
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
          ++i_;
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!word("\\u")) fail("lone high surrogate");
            const unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          --i_;
          break;
        }
        default:
          fail("bad escape");
      }
    }
    ++i_;
    return out;
  }

  std::string_view s_;
  size_t i_ = 0;
};

Json parse_json(std::string_view text) { return JsonParser(text).document(); }

size_t count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The opening tags of the page's <script> elements, found as a browser finds them: a script's text ends at the
// first "</script" (the writers leave no "<!--" that would change that).
std::vector<std::string> script_tags(const std::string& html) {
  std::vector<std::string> tags;
  for (size_t at = html.find("<script"); at != std::string::npos; at = html.find("<script", at)) {
    const size_t text = html.find('>', at) + 1;
    tags.push_back(html.substr(at, text - at));
    at = html.find("</script", text);
  }
  return tags;
}

// ---- the report

const std::string kEvilKernel = "evil</script><script>alert('x')</script>&\"<!--<script>";
const std::string kTemplateKernel = "void f<int, 2>(float*)";
const std::string kCommaCase = "attn, \"windowed\" 7x7 | mask";

CaseResult make_case(const std::string& name, const std::string& variant, std::vector<double> samples_ns) {
  CaseResult c;
  c.id = 1;
  c.info = {name, "layernorm", "8192x768", "fp16", variant, 25165824, 0};
  c.samples_ns = std::move(samples_ns);
  c.median_ns = c.samples_ns.empty() ? std::numeric_limits<double>::quiet_NaN() : c.samples_ns[1];
  c.q1_ns = c.samples_ns.empty() ? c.median_ns : c.samples_ns[0];
  c.q3_ns = c.samples_ns.empty() ? c.median_ns : c.samples_ns[2];
  c.min_ns = c.q1_ns;
  c.max_ns = c.q3_ns;
  return c;
}

RunReport make_report() {
  RunReport r;
  r.run.id = 7;
  r.run.label = "nightly, \"h100\"";
  r.run.command_line = "fusekit run --suite ops | tee log.txt";
  r.run.git_commit = "0123456789abcdef0123456789abcdef01234567";
  r.run.host = "gpu-node-3";
  r.run.gpu_name = "NVIDIA H100 80GB HBM3";
  r.run.gpu_uuid = "GPU-1234";
  r.run.driver_version = "550.54.15";
  r.run.cuda_version = "12.4";
  r.run.libtorch_version = "2.3.0";
  r.run.status = "ok";
  r.run.dropped_records = 3;
  r.run.copy_ceiling_bytes_per_second = 3.01e12;

  CaseResult baseline = make_case("layernorm/8192x768/fp16/fwd", "baseline", {24000, 25000, 26500});
  baseline.speedup = 1.0;
  baseline.bandwidth_bytes_per_s = 25165824 / 25e-6;
  baseline.bandwidth_percent = 100.0 * 25165824 / 25e-6 / 3.01e12;
  CaseResult fused = make_case("layernorm/8192x768/fp16/fwd", "fused", {9990, 10000.4, 10020});
  fused.speedup = 25000 / 10000.4;
  fused.bandwidth_bytes_per_s = 25165824 / 10000.4e-9;
  fused.bandwidth_percent = 100.0 * 25165824 / 10000.4e-9 / 3.01e12;
  fused.flops_per_s = 1.5e12;
  CaseResult peer = make_case(kCommaCase, "peer:eager", {1.5e6, 2.25e6, 3e6});  // no optional field
  CaseResult unmeasured = make_case("gelu/1x1/fp32/fwd", "fused", {});          // NaN statistics
  r.cases = {baseline, fused, peer, unmeasured};

  const std::vector<std::string> names = {kTemplateKernel, kEvilKernel, "a|b", "with, comma \"and quote\"",
                                          "tab\there\x01 and \xC2\xB5s and bad \xFF byte"};
  for (size_t i = 0; i < 25; ++i) {
    profiler::KernelStats k;
    k.name = i < names.size() ? names[i] : "kernel_" + std::to_string(i);
    k.total_ns = 1000000 - 1000 * i;
    k.instances = 10 + i;
    k.time_percent = 100.0 / 25;
    k.avg_ns = static_cast<double>(k.total_ns) / static_cast<double>(k.instances);
    k.med_ns = k.avg_ns;
    k.min_ns = 900;
    k.max_ns = 1100 + i;
    k.stddev_ns = 12.5;
    r.kernels.push_back(k);
  }
  r.ranges = {{"train_step", 10, 5000000, 4000000, 30, 4500000, 0.2},
              {"fwd | bwd", 10, 2000000, 1900000, 12, 1950000, 0.05}};
  r.totals = {6000000, 4500000, 4900000, 42, 2, 4096, 1, 64, 20, 0.25};
  return r;
}

RunReport make_empty_report() {
  RunReport r;
  r.run.id = 8;
  r.run.status = "failed";
  r.run.exit_code = 1;
  return r;
}

// ---- Training steps: throughput from the batch in the shape, peak memory from the case metric

TEST(StepCases, BatchFromTheShapeOfStepOperatorsOnly) {
  store::CaseInfo info;
  info.op = "bert_step";
  info.shape = "bert-base:b64:s128";
  EXPECT_EQ(step_batch(info), 64);
  info.shape = "swin-t:b128";
  EXPECT_EQ(step_batch(info), 128);
  info.shape = "bert-large:s512:b8";
  EXPECT_EQ(step_batch(info), 8);
  info.shape = "bert-base";  // the preset's batch: not known here
  EXPECT_EQ(step_batch(info), std::nullopt);
  info.shape = "bert-base:bx:s128";
  EXPECT_EQ(step_batch(info), std::nullopt);
  info.shape = "bert-base:b0";
  EXPECT_EQ(step_batch(info), std::nullopt);
  info.shape = "bert-base:b12x";
  EXPECT_EQ(step_batch(info), std::nullopt);
  info.op = "layernorm";  // not a step: a ":b" field means something else, if anything
  info.shape = "8192x768:b64";
  EXPECT_EQ(step_batch(info), std::nullopt);

  CaseResult c;
  c.info.op = "swin_step";
  c.info.shape = "swin-t:b128";
  c.median_ns = 20e6;  // 20 ms a step of 128 images
  EXPECT_DOUBLE_EQ(*items_per_second(c), 6400.0);
  c.median_ns = NAN;  // not measured
  EXPECT_EQ(items_per_second(c), std::nullopt);
}

TEST(StepCases, CsvMarkdownAndHtmlShowThroughputAndPeakMemory) {
  RunReport r;
  r.run.id = 3;
  for (const auto& [variant, median, mib] :
       {std::tuple{"fused", 12.5e6, 4434.0}, std::tuple{"baseline", 34.6e6, 8876.0},
        std::tuple{"peer:eager", 49.1e6, 7722.0}}) {
    CaseResult c;
    c.info.name = "bert_step/bert-base:b64:s128/fp16/fwd";
    c.info.op = "bert_step";
    c.info.shape = "bert-base:b64:s128";
    c.info.dtype = "fp16";
    c.info.variant = variant;
    c.samples_ns = {median};
    c.median_ns = c.q1_ns = c.q3_ns = c.min_ns = c.max_ns = median;
    c.metrics = {{"peak_memory_bytes", mib * (1 << 20)}};
    r.cases.push_back(c);
  }
  const auto rows = parse_csv(cases_csv(r));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1][18], "4434");
  EXPECT_EQ(rows[1][19], "5120.0");  // 64 sequences in 12.5 ms
  EXPECT_EQ(rows[2][18], "8876");
  const std::string markdown = report_markdown(r);
  EXPECT_NE(markdown.find("| Peak memory (MiB) | Items/s | Variant | Case |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| 4434 | 5120.0 | fused |"), std::string::npos) << markdown;
  const std::string html = report_html(r);
  EXPECT_NE(html.find("Items/s"), std::string::npos);
  EXPECT_NE(html.find(">5120<"), std::string::npos);
  EXPECT_NE(html.find(">4434<small>8876</small>"), std::string::npos);
}

// ---- CSV

TEST(CasesCsv, ReadsBackCellForCell) {
  const RunReport r = make_report();
  const auto rows = parse_csv(cases_csv(r));
  ASSERT_EQ(rows.size(), 1 + r.cases.size());
  EXPECT_EQ(rows[0], (std::vector<std::string>{"run_id",
                                               "name",
                                               "op",
                                               "shape",
                                               "dtype",
                                               "variant",
                                               "samples",
                                               "median_us",
                                               "q1_us",
                                               "q3_us",
                                               "min_us",
                                               "max_us",
                                               "speedup",
                                               "bytes",
                                               "bandwidth_GBps",
                                               "bandwidth_percent",
                                               "flops",
                                               "tflops",
                                               "peak_memory_mib",
                                               "items_per_second"}));
  for (size_t i = 0; i < r.cases.size(); ++i) {
    ASSERT_EQ(rows[i + 1].size(), 20u) << i;
    EXPECT_EQ(rows[i + 1][0], "7");
    EXPECT_EQ(rows[i + 1][1], r.cases[i].info.name);
    EXPECT_EQ(rows[i + 1][5], r.cases[i].info.variant);
    EXPECT_EQ(rows[i + 1][6], std::to_string(r.cases[i].samples_ns.size()));
  }
  // fused: median 10000.4 ns is 10.000 us to the nanosecond; speedup 25000 / 10000.4.
  EXPECT_EQ(rows[2][7], "10.000");
  EXPECT_EQ(rows[2][12], "2.4999");
  EXPECT_EQ(rows[2][17], "1.5000");
  EXPECT_EQ(rows[1][13], "25165824");
  // The peer has no optional field, the unmeasured case no statistics: empty cells, not zeros.
  for (size_t column : {12, 14, 15, 17}) EXPECT_EQ(rows[3][column], "") << column;
  for (size_t column : {7, 8, 9, 10, 11}) EXPECT_EQ(rows[4][column], "") << column;
  EXPECT_EQ(rows[3][7], "2250.000");
}

TEST(CasesWideCsv, OneRowPerCaseWithTheVariantsAsColumns) {
  RunReport r;
  r.run.id = 2;
  auto add = [&](const std::string& name, const std::string& variant, double median_ns) {
    CaseResult c;
    c.info = {name, "op", "8x8", "fp16", variant, 1024, 0};
    c.median_ns = median_ns;
    r.cases.push_back(c);
  };
  add("op/8x8/fp16/fwd", "baseline", 4000);
  add("op/8x8/fp16/fwd", "fused", 1000);
  add("op/8x8/fp16/fwd", "peer:eager", 5000);
  add("op/8x8/fp16/fwd", "peer:compile", 2000);
  add("op/8x8/fp16/fwd", "fused:no-master", 900);  // fusekit's own: never the best other
  add("op/16x8/fp16/fwd", "fused", 3000);          // no other variant: empty cells
  const std::string csv = cases_wide_csv(r);
  EXPECT_EQ(csv,
            "run_id,name,op,shape,dtype,bytes,fused_median_us,baseline_median_us,fused:no-master_median_us,"
            "peer:compile_median_us,peer:eager_median_us,fused_vs_baseline,best_other,fused_vs_best_other\n"
            "2,op/8x8/fp16/fwd,op,8x8,fp16,1024,1.000,4.000,0.900,2.000,5.000,4.0000,peer:compile,2.0000\n"
            "2,op/16x8/fp16/fwd,op,8x8,fp16,1024,3.000,,,,,,,\n");
}

TEST(KernelsCsv, HasTheNsysColumnsAndEveryKernel) {
  const RunReport r = make_report();
  const auto rows = parse_csv(kernels_csv(r));
  ASSERT_EQ(rows.size(), 1 + r.kernels.size());
  EXPECT_EQ(rows[0], (std::vector<std::string>{"Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)",
                                               "Min (ns)", "Max (ns)", "StdDev (ns)", "Name"}));
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    ASSERT_EQ(rows[i + 1].size(), 9u);
    EXPECT_EQ(rows[i + 1][8], r.kernels[i].name);
    EXPECT_EQ(rows[i + 1][1], std::to_string(r.kernels[i].total_ns));
  }
  EXPECT_EQ(rows[1][0], "4.0");
}

TEST(RangesCsv, ReadsBack) {
  const RunReport r = make_report();
  const auto rows = parse_csv(ranges_csv(r));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2], (std::vector<std::string>{"2000000", "1900000", "5.0", "10", "12", "1950000", "fwd | bwd"}));
}

TEST(Csv, EmptyReportHasHeadersOnly) {
  const RunReport r = make_empty_report();
  EXPECT_EQ(parse_csv(cases_csv(r)).size(), 1u);
  EXPECT_EQ(parse_csv(kernels_csv(r)).size(), 1u);
  EXPECT_EQ(parse_csv(ranges_csv(r)).size(), 1u);
}

// ---- Markdown

// The table lines that follow a heading, up to the first line that is not one.
std::vector<std::string> table_after(const std::string& markdown, const std::string& heading) {
  std::vector<std::string> lines;
  size_t at = markdown.find("\n" + heading + "\n");
  if (at == std::string::npos) return lines;
  at = markdown.find("\n|", at);
  while (at != std::string::npos && markdown.compare(at, 2, "\n|") == 0) {
    const size_t end = markdown.find('\n', at + 1);
    lines.push_back(markdown.substr(at + 1, end - at - 1));
    at = end;
  }
  return lines;
}

// Cells of a GFM table line, split at pipes that are not escaped.
size_t cell_count(const std::string& line) {
  size_t pipes = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\')
      ++i;
    else if (line[i] == '|')
      ++pipes;
  }
  return pipes - 1;
}

// The terminal's range table: every time column, a legend, and the line that explains busy time
// above wall time only where a range shows it (kernels run on after an asynchronous launch returns).
// Reports of different runs get titles that tell them apart: what ran, on which GPU, at which commit.
TEST(RunTitle, SaysWhatRanWhereAndAtWhichCommit) {
  RunInfo run;
  run.id = 3;
  run.gpu_name = "NVIDIA H100 80GB HBM3";
  run.git_commit = "6aab4587ddef3db361a59263af98dce11f24e97b";
  run.command_line = "fusekit bench --suite attention --dtype fp16 --db out/fusekit.db";
  EXPECT_EQ(run_title(run), "fusekit attention suite on NVIDIA H100 80GB HBM3 at 6aab458 (run 3)");
  run.command_line = "build/fusekit bench --db x.db --op layernorm --shape 16384x1024 --dtype bf16 --backward";
  EXPECT_EQ(run_title(run), "fusekit layernorm 16384x1024 bf16 fwd+bwd on NVIDIA H100 80GB HBM3 at 6aab458 (run 3)");
  run.command_line = "fusekit bench --db x.db";
  EXPECT_EQ(run_title(run), "fusekit demo suite on NVIDIA H100 80GB HBM3 at 6aab458 (run 3)");
  run.command_line = "python3 train.py";  // a traced program: its label
  run.label = "train.py";
  run.gpu_name.clear();
  run.git_commit.clear();
  EXPECT_EQ(run_title(run), "fusekit train.py (run 3)");
}

TEST(IndexHtml, LinksEveryReportWithItsTitleAndEscapes) {
  IndexEntry a;
  a.href = "h100-ops.html";
  a.run.id = 1;
  a.run.command_line = "fusekit bench --suite ops";
  a.run.gpu_name = "NVIDIA H100 80GB HBM3";
  a.run.git_commit = "6aab4587ddef3db361a59263af98dce11f24e97b";
  a.cases = 93;
  a.variants = 6;
  IndexEntry b = a;
  b.href = "a&b.html";
  b.run.command_line = "fusekit bench --suite attention <x>";
  const std::string page = index_html({a, b});
  EXPECT_NE(page.find("<a href=\"h100-ops.html\">fusekit ops suite on NVIDIA H100 80GB HBM3 at 6aab458 (run 1)</a>"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("href=\"a&amp;b.html\""), std::string::npos);
  EXPECT_NE(page.find("&lt;x&gt;"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);  // nothing to run, nothing fetched
  EXPECT_NE(index_html({}).find("No reports."), std::string::npos);
}

TEST(RangeTableText, ExplainsBusyAboveWall) {
  profiler::RangeStats outlasted;
  outlasted.name = "rep";
  outlasted.instances = 10;
  outlasted.wall_ns = 164100;
  outlasted.extent_ns = 2425900;
  outlasted.busy_ns = 821100;
  outlasted.idle_fraction = 1.0 - 821100.0 / 2425900.0;
  const std::string text = range_table_text({outlasted}, 10);
  EXPECT_NE(text.find("GPU extent (us)"), std::string::npos) << text;
  EXPECT_NE(text.find("2425.9"), std::string::npos) << text;
  EXPECT_NE(text.find("Idle: 1 - busy / extent"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU busy above wall"), std::string::npos) << text;

  profiler::RangeStats inside = outlasted;
  inside.busy_ns = 100000;
  inside.extent_ns = 164100;
  EXPECT_EQ(range_table_text({inside}, 10).find("GPU busy above wall"), std::string::npos);
}

TEST(Markdown, TablesHaveTheirRowsAndEscapedPipes) {
  const RunReport r = make_report();
  const std::string md = report_markdown(r);
  const auto cases = table_after(md, "## Cases");
  const auto kernels = table_after(md, "## Kernels");
  const auto ranges = table_after(md, "## Ranges");
  EXPECT_EQ(cases.size(), 2 + r.cases.size());
  EXPECT_EQ(kernels.size(), 2 + kTopKernels);
  EXPECT_EQ(ranges.size(), 2 + r.ranges.size());
  for (const auto* table : {&cases, &kernels, &ranges}) {
    for (const std::string& line : *table) EXPECT_EQ(cell_count(line), cell_count(table->front())) << line;
  }
  EXPECT_EQ(cell_count(cases.front()), 9u);
  EXPECT_EQ(cell_count(kernels.front()), 9u);
  EXPECT_NE(md.find("`a\\|b`"), std::string::npos);
  EXPECT_NE(md.find("`fwd \\| bwd`"), std::string::npos);
  EXPECT_NE(md.find("5 more kernels, 20.0 % of kernel time, are not shown."), std::string::npos);
  EXPECT_NE(md.find("| 10.00 | 9.990–10.02 | 3 | 2.50x |"), std::string::npos) << md;
}

TEST(Markdown, HasTheRunMetadata) {
  const RunReport r = make_report();
  const std::string md = report_markdown(r);
  for (const std::string& expected : std::vector<std::string>{
           "# fusekit run 7: nightly, \"h100\"", "| Commit | `" + r.run.git_commit + "` |",
           "| GPU | NVIDIA H100 80GB HBM3 (GPU-1234) |", "| Driver | 550.54.15 |", "| CUDA | 12.4 |",
           "| libtorch | 2.3.0 |", "| Command line | `fusekit run --suite ops \\| tee log.txt` |",
           "| Dropped records | 3 |", "3 records were dropped"}) {
    EXPECT_NE(md.find(expected), std::string::npos) << expected;
  }
  // A name with Markdown punctuation stays literal inside its code span.
  EXPECT_NE(md.find("`void f<int, 2>(float*)`"), std::string::npos);
}

TEST(Markdown, EmptyReportSaysSo) {
  const std::string md = report_markdown(make_empty_report());
  EXPECT_NE(md.find("No cases in this run."), std::string::npos);
  EXPECT_NE(md.find("No kernels were traced in this run."), std::string::npos);
  EXPECT_NE(md.find("No NVTX ranges were traced in this run."), std::string::npos);
  EXPECT_TRUE(table_after(md, "## Cases").empty());
}

// ---- GPU time by kernel category and nested range

// Two variants of one step case: fused with 2 marked repetitions and nested ranges, a peer
// without "rep" ranges or nested ranges; and a case whose name needs quoting.
std::vector<CaseBreakdown> make_breakdowns() {
  using profiler::KernelCategory;
  auto at = [](KernelCategory c) { return static_cast<size_t>(c); };
  CaseBreakdown fused{"step/base/fp16/fwd", "fused", {}};
  fused.breakdown.repetitions = 2;
  fused.breakdown.kernels = 10;
  fused.breakdown.gpu_ns = 8000;
  fused.breakdown.category_ns[at(KernelCategory::gemm)] = 6000;
  fused.breakdown.category_ns[at(KernelCategory::optimizer)] = 2000;
  fused.breakdown.nested = {{{"step"}, 7000, 1}, {{"step", "forward"}, 2000, 2}, {{"step", "backward"}, 3000, 3}};
  CaseBreakdown peer{"step/base/fp16/fwd", "peer:eager", {}};
  peer.breakdown.kernels = 30;
  peer.breakdown.gpu_ns = 30000;
  peer.breakdown.category_ns[at(KernelCategory::gemm)] = 15000;
  peer.breakdown.category_ns[at(KernelCategory::elementwise)] = 15000;
  CaseBreakdown quoted{"with, comma \"and quote\"", "fused", {}};
  quoted.breakdown.repetitions = 1;
  quoted.breakdown.kernels = 1;
  quoted.breakdown.gpu_ns = 1500;
  quoted.breakdown.category_ns[at(KernelCategory::other)] = 1500;
  return {fused, peer, quoted};
}

TEST(ShareCell, PercentAndMicrosecondsPerRepetition) {
  EXPECT_EQ(share_cell(6000, 8000, 2), "75.0 (3.000)");
  EXPECT_EQ(share_cell(15000, 30000, 0), "50.0");
  EXPECT_EQ(share_cell(0, 30000, 3), "-");
}

TEST(CategoriesCsv, EveryCategoryAsPercentAndMicrosecondsPerRepetition) {
  RunReport r;
  r.run.id = 4;
  r.case_breakdowns = make_breakdowns();
  const auto rows = parse_csv(categories_csv(r));
  ASSERT_EQ(rows.size(), 4u);
  ASSERT_EQ(rows[0].size(), 7u + 2 * 9);
  EXPECT_EQ(std::vector<std::string>(rows[0].begin(), rows[0].begin() + 9),
            (std::vector<std::string>{"run_id", "name", "variant", "repetitions", "kernels", "gpu_us", "gpu_us_per_rep",
                                      "gemm_percent", "gemm_us_per_rep"}));
  EXPECT_EQ(rows[0][19], "copy_cast_percent");
  EXPECT_EQ(rows[0].back(), "other_us_per_rep");
  EXPECT_EQ(
      std::vector<std::string>(rows[1].begin(), rows[1].begin() + 9),
      (std::vector<std::string>{"4", "step/base/fp16/fwd", "fused", "2", "10", "8.000", "4.000", "75.00", "3.000"}));
  EXPECT_EQ(rows[1][17], "25.00");  // optimizer
  EXPECT_EQ(rows[1][18], "1.000");
  EXPECT_EQ(rows[1][9], "0.00");  // attention: none
  // The peer marks no repetitions: the total and percentages only.
  EXPECT_EQ(rows[2][3], "0");
  EXPECT_EQ(rows[2][5], "30.000");
  EXPECT_EQ(rows[2][6], "");
  EXPECT_EQ(rows[2][7], "50.00");
  EXPECT_EQ(rows[2][8], "");
  EXPECT_EQ(rows[3][1], "with, comma \"and quote\"");
  EXPECT_EQ(rows[3].back(), "1.500");
  EXPECT_EQ(parse_csv(categories_csv(make_empty_report())).size(), 1u);
}

TEST(StepRangesCsv, ARowPerNestedRange) {
  RunReport r;
  r.run.id = 4;
  r.case_breakdowns = make_breakdowns();
  const auto rows = parse_csv(step_ranges_csv(r));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0],
            (std::vector<std::string>{"run_id", "name", "variant", "range", "depth", "percent", "us_per_rep"}));
  EXPECT_EQ(rows[3],
            (std::vector<std::string>{"4", "step/base/fp16/fwd", "fused", "step > backward", "2", "37.50", "1.500"}));
}

TEST(CategoryTable, ShowsTheCategoriesThatHoldTime) {
  const ReportTable t = category_table(make_breakdowns());
  EXPECT_EQ(t.header, (std::vector<std::string>{"Reps", "GPU (us/rep)", "GEMM", "elementwise", "optimizer", "other",
                                                "Variant", "Case"}));
  EXPECT_EQ(t.text_from, 6u);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0], (std::vector<std::string>{"2", "4.000", "75.0 (3.000)", "-", "25.0 (1.000)", "-", "fused",
                                                 "step/base/fp16/fwd"}));
  EXPECT_EQ(t.rows[1],
            (std::vector<std::string>{"-", "-", "50.0", "50.0", "-", "-", "peer:eager", "step/base/fp16/fwd"}));
}

TEST(NestedRangeTables, VariantsSideBySideWithTheRestInNoRange) {
  const std::vector<TitledTable> tables = nested_range_tables(make_breakdowns(), false);
  ASSERT_EQ(tables.size(), 1u);  // the quoted case holds no nested range
  const ReportTable& t = tables[0].table;
  EXPECT_EQ(tables[0].title, "step/base/fp16/fwd");
  EXPECT_EQ(t.header, (std::vector<std::string>{"fused", "peer:eager", "Range"}));
  ASSERT_EQ(t.rows.size(), 4u);
  EXPECT_EQ(t.rows[0], (std::vector<std::string>{"87.5 (3.500)", "-", "step"}));
  EXPECT_EQ(t.rows[2], (std::vector<std::string>{"37.5 (1.500)", "-", "step > backward"}));
  EXPECT_EQ(t.rows[3], (std::vector<std::string>{"12.5 (0.500)", "100.0", "(in no nested range)"}));
  const std::string text = nested_range_tables_text(make_breakdowns());
  EXPECT_NE(text.find("step/base/fp16/fwd:"), std::string::npos);
  EXPECT_NE(text.find("  backward\n"), std::string::npos) << text;
}

TEST(Markdown, GpuTimeByCategoryAndStepRange) {
  RunReport r = make_report();
  EXPECT_EQ(report_markdown(r).find("## GPU time by kernel category"), std::string::npos);
  r.case_breakdowns = make_breakdowns();
  const std::string md = report_markdown(r);
  const auto categories = table_after(md, "## GPU time by kernel category");
  ASSERT_EQ(categories.size(), 2u + 3);
  for (const std::string& line : categories) EXPECT_EQ(cell_count(line), 8u) << line;
  EXPECT_NE(md.find("| 2 | 4.000 | 75.0 (3.000) | - | 25.0 (1.000) | - | fused | `step/base/fp16/fwd` |"),
            std::string::npos)
      << md;
  const auto steps = table_after(md, "### `step/base/fp16/fwd`");
  ASSERT_EQ(steps.size(), 2u + 4);
  EXPECT_NE(md.find("| 25.0 (1.000) | - | `step > forward` |"), std::string::npos);
}

// ---- JSON

TEST(Json, StringsEscapeControlCharactersAndBadUtf8) {
  EXPECT_EQ(json_string("a\"b\\c\n\x01\x1f"), "\"a\\\"b\\\\c\\n\\u0001\\u001f\"");
  EXPECT_EQ(json_string("\xC2\xB5s"), "\"\xC2\xB5s\"");
  EXPECT_EQ(json_string("\xFF\xC2"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(json_string("\xED\xA0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // an encoded surrogate is not UTF-8
  EXPECT_EQ(json_number(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(json_number(std::nan("")), "null");
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(std::optional<double>()), "null");
}

TEST(Json, ReportParsesToTheSameValues) {
  const RunReport r = make_report();
  const Json j = parse_json(report_json(r));
  EXPECT_EQ(j["run"]["label"].text, r.run.label);
  EXPECT_EQ(j["run"]["command_line"].text, r.run.command_line);
  EXPECT_EQ(j["run"]["dropped_records"].value, 3);
  EXPECT_EQ(j["totals"]["kernels"].value, 42);
  const Json& cases = j["cases"];
  ASSERT_EQ(cases.items.size(), r.cases.size());
  for (size_t i = 0; i < r.cases.size(); ++i) {
    EXPECT_EQ(cases.items[i]["name"].text, r.cases[i].info.name);
    ASSERT_EQ(cases.items[i]["samples_ns"].items.size(), r.cases[i].samples_ns.size());
    for (size_t s = 0; s < r.cases[i].samples_ns.size(); ++s)
      EXPECT_EQ(cases.items[i]["samples_ns"].items[s].value, r.cases[i].samples_ns[s]);
  }
  EXPECT_EQ(cases.items[1]["speedup"].value, *r.cases[1].speedup);  // shortest form reads back exactly
  EXPECT_EQ(cases.items[2]["speedup"].kind, Json::null);
  EXPECT_EQ(cases.items[2]["bandwidth_percent"].kind, Json::null);
  EXPECT_EQ(cases.items[3]["median_ns"].kind, Json::null);
  ASSERT_EQ(j["kernels"].items.size(), r.kernels.size());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(j["kernels"].items[i]["name"].text, r.kernels[i].name);
  EXPECT_EQ(j["kernels"].items[4]["name"].text, "tab\there\x01 and \xC2\xB5s and bad \xEF\xBF\xBD byte");
  ASSERT_EQ(j["ranges"].items.size(), 2u);
  EXPECT_EQ(j["ranges"].items[1]["idle_fraction"].value, 0.05);
}

TEST(Json, EmptyReportParses) {
  const Json j = parse_json(report_json(make_empty_report()));
  EXPECT_TRUE(j["cases"].items.empty());
  EXPECT_TRUE(j["kernels"].items.empty());
  EXPECT_EQ(j["run"]["status"].text, "failed");
}

// ---- HTML

TEST(ChartJs, IsEmbedded) {
  const std::string_view js = chartjs_source();
  EXPECT_GT(js.size(), 100u * 1024);
  EXPECT_NE(js.find("Chart"), std::string_view::npos);
  EXPECT_NE(js.find("v3.9.1"), std::string_view::npos);
  // Nothing in it could end its <script> element early, so it is embedded unchanged.
  EXPECT_EQ(js.find("</"), std::string_view::npos);
  EXPECT_EQ(js.find("<!--"), std::string_view::npos);
}

// Where the page names a URL that a browser would load.
void expect_nothing_remote(const std::string& html) {
  std::string lower = html;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(lower.find("<link"), std::string::npos);
  EXPECT_EQ(lower.find("@import"), std::string::npos);
  for (std::string_view opener : {"src=", "href=", "url(", "srcset=", "poster=", "data=", "action="}) {
    for (size_t at = lower.find(opener); at != std::string::npos; at = lower.find(opener, at + 1)) {
      std::string_view rest = std::string_view(lower).substr(at + opener.size(), 16);
      while (!rest.empty() && (rest[0] == '"' || rest[0] == '\'' || rest[0] == ' ')) rest.remove_prefix(1);
      EXPECT_FALSE(rest.starts_with("http://") || rest.starts_with("https://") || rest.starts_with("//"))
          << html.substr(at, 60);
    }
  }
}

std::string data_element(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"fusekit-data\">";
  const size_t begin = html.find(open);
  if (begin == std::string::npos) return "";
  const size_t end = html.find("</script>", begin);
  return html.substr(begin + open.size(), end - begin - open.size());
}

TEST(Html, EmbedsChartJsFetchesNothingAndEscapesNames) {
  RunReport r = make_report();
  // The fused variant's traced kernels: the kernel named "...</script>..." among them.
  VariantKernels traced;
  traced.kernel_ns = 3000;
  traced.launches = 3;
  traced.repetitions = 3;
  traced.kernels = {{kEvilKernel, 2000, 2}, {kTemplateKernel, 1000, 1}};
  r.case_kernels[{"layernorm/8192x768/fp16/fwd", "fused"}] = traced;
  const std::string html = report_html(r);
  EXPECT_NE(html.find(chartjs_source()), std::string::npos);
  expect_nothing_remote(html);
  // The data element, Chart.js and the page's own script; the kernel named "...</script>..." closes none.
  EXPECT_EQ(script_tags(html), (std::vector<std::string>{"<script type=\"application/json\" id=\"fusekit-data\">",
                                                         "<script>", "<script>"}));
  EXPECT_EQ(html.find(kEvilKernel), std::string::npos);
  EXPECT_EQ(html.find("<!--"), std::string::npos);
  EXPECT_NE(html.find("evil&lt;/script&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;&lt;!--"),
            std::string::npos);
  EXPECT_NE(html.find("void f&lt;int, 2&gt;(float*)"), std::string::npos);
  EXPECT_NE(html.find("attn, &quot;windowed&quot; 7x7 | mask"), std::string::npos);
  // One operator (every case of the sample is a layernorm case): its speedup chart; the whole run's kernel
  // chart is for runs without cases.
  EXPECT_NE(html.find("<canvas id=\"speedup-0\">"), std::string::npos);
  EXPECT_EQ(html.find("<canvas id=\"chart-kernels\">"), std::string::npos);
  // The page's data is JSON and carries the names unchanged.
  const Json data = parse_json(data_element(html));
  ASSERT_EQ(data["ops"].items.size(), 1u);
  ASSERT_EQ(data["cases"].items.size(), 3u);  // a case per name
  EXPECT_EQ(data["cases"].items[1]["name"].text, kCommaCase);
  ASSERT_EQ(data["names"].items.size(), 2u);
  EXPECT_EQ(data["names"].items[0]["name"].text, kEvilKernel);
  EXPECT_EQ(data["names"].items[1]["short"].text, "f");
  const Json& fused = data["cases"].items[0]["variants"].items[0];
  EXPECT_EQ(fused["variant"].text, "fused");
  EXPECT_EQ(fused["reps"].value, 3);
  ASSERT_EQ(fused["top"].items.size(), 2u);
  EXPECT_EQ(fused["top"].items[0].items[1].value, 2000);
  // Tables: metadata rows; the operators (header, one row); the operator's cases (header, a row per case
  // name); the whole run's kernels and ranges.
  EXPECT_EQ(count(html, "<tr>"), run_metadata(r).size() + 2 + 1 + 3 + 1 + kTopKernels + 1 + r.ranges.size());
  EXPECT_NE(html.find("5 more kernels, 20.0 % of kernel time, are not shown."), std::string::npos);
}

TEST(Html, RunWithoutCasesShowsTheWholeRunsKernels) {
  RunReport r = make_report();
  r.cases.clear();
  const std::string html = report_html(r);
  EXPECT_NE(html.find("<canvas id=\"chart-kernels\">"), std::string::npos);
  EXPECT_NE(html.find("No cases in this run."), std::string::npos);
  const Json data = parse_json(data_element(html));
  ASSERT_EQ(data["kernels"].items.size(), kTopKernels);
  EXPECT_EQ(data["kernels"].items[1]["name"].text, kEvilKernel);
  EXPECT_EQ(data["kernels"].items[0]["short"].text, "f");
  EXPECT_EQ(data["other_kernels"]["count"].value, 5);
}

TEST(Html, EmptyReportRendersWithoutCharts) {
  const std::string html = report_html(make_empty_report());
  EXPECT_NE(html.find("No cases in this run."), std::string::npos);
  EXPECT_NE(html.find("No kernels were traced in this run."), std::string::npos);
  EXPECT_EQ(html.find("<canvas"), std::string::npos);
  EXPECT_EQ(script_tags(html).size(), 3u);
  const Json data = parse_json(data_element(html));
  EXPECT_TRUE(data["cases"].items.empty());
  expect_nothing_remote(html);
}

TEST(Html, ScriptSafeKeepsJsonValid) {
  EXPECT_EQ(script_safe("\"</script><!--\""), "\"<\\/script><\\u0021--\"");
  EXPECT_EQ(parse_json(script_safe(json_string("</script><!--x"))).text, "</script><!--x");
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}

// ---- Chrome trace

constexpr uint64_t kOrigin = 1'700'000'000'000'000'000ull;

profiler::Trace make_trace() {
  profiler::Trace t;
  t.process_id = 4242;
  const auto kernel = [&](uint64_t start, uint64_t end, uint32_t device, uint32_t stream, uint32_t correlation,
                          std::string name) {
    profiler::KernelRecord k;
    k.start = kOrigin + start, k.end = kOrigin + end, k.device_id = device, k.stream_id = stream;
    k.correlation_id = correlation, k.process_id = 4242, k.name = std::move(name);
    k.grid_x = 64, k.grid_y = 2, k.grid_z = 1, k.block_x = 256, k.block_y = 1, k.block_z = 1;
    k.registers_per_thread = 40, k.static_shared_memory = 1024, k.dynamic_shared_memory = 49152;
    t.kernels.push_back(k);
  };
  kernel(1'234'567, 1'240'000, 0, 7, 11, kTemplateKernel);
  kernel(1'240'100, 1'250'000, 0, 13, 12, kEvilKernel);
  kernel(1'240'200, 1'245'000, 1, 7, 13, "gemm");
  t.memcpys.push_back({kOrigin + 500'000, kOrigin + 600'000, 0, 1, 7, 10, 4242, 4096, 1, 0, 3});
  t.memcpys.push_back({kOrigin + 1'300'000, kOrigin + 1'301'000, 0, 1, 13, 99, 4242, 4096, 2, 3, 0});
  t.memsets.push_back({kOrigin + 400'000, kOrigin + 401'000, 0, 1, 7, 9, 4242, 1024, 0});
  const auto api = [&](uint64_t start, uint64_t end, uint32_t tid, uint32_t correlation, std::string name) {
    t.api_calls.push_back(
        {kOrigin + start, kOrigin + end, 4242, tid, correlation, 1, profiler::ApiKind::runtime, 0, std::move(name)});
  };
  api(390'000, 402'000, 100, 9, "cudaMemsetAsync");
  api(450'000, 460'000, 100, 10, "cudaMemcpyAsync");
  api(1'200'000, 1'210'000, 100, 11, "cudaLaunchKernel");
  api(1'211'000, 1'215'000, 101, 12, "cudaLaunchKernel");
  api(1'216'000, 1'220'000, 101, 13, "cudaLaunchKernel");
  t.ranges.push_back({kOrigin + 100, kOrigin + 1'260'000, 4242, 100, 100, profiler::kNvtxPushPopRange, "step", ""});
  t.ranges.push_back({kOrigin + 1'100'000, kOrigin + 1'230'000, 4242, 100, 100, profiler::kNvtxPushPopRange,
                      "fwd \"quoted\"", "fusekit"});
  t.ranges.push_back({kOrigin + 1'210'500, 0, 4242, 101, 101, profiler::kNvtxPushPopRange, "never closed", ""});
  t.ranges.push_back({kOrigin, kOrigin + 1'000'000, 4242, 100, 101, profiler::kNvtxStartEndRange, "load", ""});
  return t;
}

TEST(ChromeTrace, OneEventPerRecordOnItsTrack) {
  const profiler::Trace trace = make_trace();
  RunInfo run;
  run.id = 7;
  run.command_line = "python3 \"train.py\"";
  const Json j = parse_json(chrome_trace_json(trace, run));
  EXPECT_EQ(j["displayTimeUnit"].text, "ns");
  EXPECT_EQ(j["otherData"]["command_line"].text, run.command_line);
  std::map<std::string, size_t> complete, phases;
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;
  std::map<int64_t, std::string> process_names;
  double earliest = 1e300;
  for (const Json& e : j["traceEvents"].items) {
    const std::string ph = e["ph"].text;
    ++phases[ph];
    const auto pid = static_cast<int64_t>(e["pid"].value), tid = static_cast<int64_t>(e["tid"].value);
    if (ph == "M" && e["name"].text == "thread_name") thread_names[{pid, tid}] = e["args"]["name"].text;
    if (ph == "M" && e["name"].text == "process_name") process_names[pid] = e["args"]["name"].text;
    if (ph == "M") continue;
    earliest = std::min(earliest, e["ts"].value);
    if (ph != "X") continue;
    ++complete[e["cat"].text];
    EXPECT_GE(e["dur"].value, 0);
    const std::string& cat = e["cat"].text;
    if (cat == "kernel" || cat == "memcpy" || cat == "memset")
      EXPECT_GE(pid, kChromeTraceGpuPidBase) << cat;
    else
      EXPECT_EQ(pid, 4242) << cat;
  }
  EXPECT_EQ(complete["kernel"], trace.kernels.size());
  EXPECT_EQ(complete["memcpy"], trace.memcpys.size());
  EXPECT_EQ(complete["memset"], trace.memsets.size());
  EXPECT_EQ(complete["cuda_api"], trace.api_calls.size());
  EXPECT_EQ(complete["nvtx"], 3u);  // the push/pop ranges; the start/end range is a "b"/"e" pair
  EXPECT_EQ(phases["b"], 1u);
  EXPECT_EQ(phases["e"], 1u);
  // Flow arrows from a launch to its work: every GPU record but the copy whose call was not traced.
  EXPECT_EQ(phases["s"], 5u);
  EXPECT_EQ(phases["f"], 5u);
  EXPECT_EQ(earliest, 0.0);

  const int64_t gpu0 = kChromeTraceGpuPidBase, gpu1 = kChromeTraceGpuPidBase + 1;
  EXPECT_EQ(process_names, (std::map<int64_t, std::string>{{4242, "4242"}, {gpu0, "GPU 0"}, {gpu1, "GPU 1"}}));
  EXPECT_EQ(thread_names, (std::map<std::pair<int64_t, int64_t>, std::string>{{{gpu0, 7}, "Stream 7"},
                                                                              {{gpu0, 13}, "Stream 13"},
                                                                              {{gpu1, 7}, "Stream 7"},
                                                                              {{4242, 100}, "Thread 100"},
                                                                              {{4242, 101}, "Thread 101"}}));
}

TEST(ChromeTrace, TimesAreMicrosecondsFromTheEarliestRecord) {
  const std::string text = chrome_trace_json(make_trace(), RunInfo{});
  const Json j = parse_json(text);
  std::map<std::string, const Json*> by_name;
  for (const Json& e : j["traceEvents"].items)
    if (e["ph"].text == "X") by_name[e["name"].text] = &e;
  const Json& k = *by_name.at(kTemplateKernel);
  EXPECT_NE(text.find("\"ts\":1234.567,\"dur\":5.433"), std::string::npos);  // exact to the nanosecond
  EXPECT_EQ(k["tid"].value, 7);
  EXPECT_EQ(k["args"]["grid"].text, "[64, 2, 1]");
  EXPECT_EQ(k["args"]["block"].text, "[256, 1, 1]");
  EXPECT_EQ(k["args"]["registers_per_thread"].value, 40);
  EXPECT_EQ(k["args"]["static_shared_memory"].value, 1024);
  EXPECT_EQ(k["args"]["dynamic_shared_memory"].value, 49152);
  EXPECT_EQ(k["args"]["correlation_id"].value, 11);
  EXPECT_EQ(by_name.at("Memcpy HtoD")->operator[]("ts").value, 500.0);
  EXPECT_EQ(by_name.at("fwd \"quoted\"")->operator[]("args")["domain"].text, "fusekit");
  // Never closed: it ends at the last timestamp of the trace, the end of the second copy.
  const Json& open = *by_name.at("never closed");
  EXPECT_EQ(open["ts"].value, 1210.5);
  EXPECT_DOUBLE_EQ(open["dur"].value, 1301.0 - 1210.5);
  EXPECT_TRUE(open["args"]["never_closed"].flag);
}

TEST(ChromeTrace, EmptyTraceIsValid) {
  const Json j = parse_json(chrome_trace_json(profiler::Trace{}, RunInfo{}));
  EXPECT_TRUE(j["traceEvents"].items.empty());
}

}  // namespace
}  // namespace fusekit::reports
