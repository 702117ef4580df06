#include "reports/html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "profiler/records.h"
#include "reports/case_groups.h"
#include "reports/chartjs.h"
#include "reports/html_assets.h"
#include "reports/json.h"
#include "reports/kernel_names.h"
#include "reports/markdown.h"

namespace fusekit::reports {
namespace {

// Per variant of a case, its largest kernels are named; those of the other variants' largest that it ran
// too are named with them, so that the shares line up across variants; the rest is "other".
constexpr size_t kTopKernelsPerVariant = 6;

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string element(std::string_view tag, std::string_view text, std::string_view css_class = "") {
  std::string open = "<" + std::string(tag);
  if (!css_class.empty()) open += " class=\"" + std::string(css_class) + "\"";
  return open + ">" + html_escape(text) + "</" + std::string(tag) + ">";
}

std::string html_table(const ReportTable& table) {
  std::string out = "<table>\n<thead><tr>";
  for (size_t c = 0; c < table.header.size(); ++c)
    out += element("th", table.header[c], c < table.text_from ? "num" : "");
  out += "</tr></thead>\n<tbody>\n";
  for (const auto& row : table.rows) {
    out += "<tr>";
    for (size_t c = 0; c < row.size(); ++c)
      out += element("td", row[c], c < table.text_from ? "num" : c + 1 == row.size() ? "name" : "");
    out += "</tr>\n";
  }
  out += "</tbody>\n</table>\n";
  if (!table.note.empty()) out += element("p", table.note, "note") + "\n";
  return out;
}

std::string canvas(std::string_view id, int height_px, std::string_view css_class = "chart") {
  return "<div class=\"" + std::string(css_class) + "\" style=\"height: " + std::to_string(height_px) +
         "px\"><canvas id=\"" + std::string(id) + "\"></canvas></div>\n";
}

std::string chart_or_line(std::string_view id, bool has_data, int height_px, std::string_view none) {
  if (!has_data) return element("p", none, "empty") + "\n";
  return canvas(id, height_px);
}

// A header cell with a second line in small type.
std::string header(std::string_view text, std::string_view detail, bool number) {
  return std::string(number ? "<th class=\"num\">" : "<th>") + html_escape(text) +
         (detail.empty() ? "" : "<small>" + html_escape(detail) + "</small>") + "</th>";
}

// A cell that sorts by `value` (empty: sorts last), showing `text` and below it `detail`.
std::string number_cell(std::optional<double> value, std::string_view text, std::string_view detail = "",
                        std::string_view css_class = "") {
  std::string out = "<td class=\"num";
  if (!css_class.empty()) out += " " + std::string(css_class);
  out += "\" data-v=\"" + (value && std::isfinite(*value) ? json_number(*value) : std::string()) + "\">" +
         html_escape(text);
  if (!detail.empty()) out += "<small>" + html_escape(detail) + "</small>";
  return out + "</td>";
}

std::string speedup_cell(std::optional<double> speedup, std::string_view detail = "") {
  if (!speedup) return number_cell(std::nullopt, "", detail);
  return number_cell(speedup, fixed(*speedup, 2) + "x", detail, *speedup >= 1 ? "faster" : "slower");
}

double geometric_mean(const std::vector<double>& values) {
  double log_sum = 0;
  for (double v : values) log_sum += std::log(v);
  return std::exp(log_sum / static_cast<double>(values.size()));
}

// The kernels the page names, each once: the JSON refers to them by index. Their labels are told apart
// among all the run's kernels (and any named that the run's list lacks), so that a kernel has the same
// label in every case.
class KernelNames {
 public:
  explicit KernelNames(const std::vector<profiler::KernelStats>& run_kernels) {
    for (const profiler::KernelStats& k : run_kernels) all_.push_back(k.name);
  }
  size_t add(const std::string& name) {
    const auto [it, added] = index_.emplace(name, names_.size());
    if (added) names_.push_back(name);
    return it->second;
  }
  std::string json() const {
    std::vector<std::string> all = all_;
    all.insert(all.end(), names_.begin(), names_.end());
    const std::vector<std::string> labels = distinct_short_names(all);
    std::vector<std::string> out;
    for (size_t i = 0; i < names_.size(); ++i)
      out.push_back(JsonObject().add("name", names_[i]).add("short", labels[all_.size() + i]).str());
    return json_array(out);
  }

 private:
  std::vector<std::string> all_;    // every kernel of the run
  std::vector<std::string> names_;  // those named on the page
  std::map<std::string, size_t> index_;
};

std::string count_text(double count) {
  return std::fabs(count - std::round(count)) < 1e-9 ? fixed(count, 0) : fixed(count, 1);
}

// The kernel block of one case: the JSON the script draws from, and the <details> it draws into.
struct KernelBlock {
  std::string json;
  std::string summary;  // "fused 1, baseline 3 kernels a repetition; ..."
  bool empty = true;
};

KernelBlock kernel_block(const CaseRow& row, const std::vector<std::string>& variants, const RunReport& report,
                         KernelNames& names) {
  std::vector<std::pair<std::string, const VariantKernels*>> present;
  std::set<std::string> shown;
  for (const std::string& v : variants) {
    const auto it = report.case_kernels.find({row.name, v});
    if (it == report.case_kernels.end() || it->second.launches == 0) continue;
    present.emplace_back(v, &it->second);
    for (size_t i = 0; i < it->second.kernels.size() && i < kTopKernelsPerVariant; ++i)
      shown.insert(it->second.kernels[i].name);
  }
  KernelBlock block;
  block.empty = present.empty();
  std::vector<std::string> json, per_repetition, in_range;
  for (const auto& [variant, vk] : present) {
    std::vector<std::string> top;
    uint64_t other_ns = 0, other_kernels = 0;
    for (const KernelTime& k : vk->kernels) {
      if (shown.count(k.name)) {
        top.push_back("[" + json_number(names.add(k.name)) + "," + json_number(k.total_ns) + "," +
                      json_number(k.instances) + "]");
      } else {
        other_ns += k.total_ns;
        ++other_kernels;
      }
    }
    json.push_back(JsonObject()
                       .add("variant", variant)
                       .add("kernel_ns", vk->kernel_ns)
                       .add("launches", vk->launches)
                       .add("reps", vk->repetitions)
                       .raw("top", json_array(top))
                       .add("other_ns", other_ns)
                       .add("other_kernels", other_kernels)
                       .str());
    if (vk->repetitions > 0) {
      per_repetition.push_back(variant + " " +
                               count_text(static_cast<double>(vk->launches) / static_cast<double>(vk->repetitions)));
    } else {
      in_range.push_back(variant + " " + std::to_string(vk->launches));
    }
  }
  const auto join = [](const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
    return out;
  };
  if (!per_repetition.empty()) block.summary = "kernels a repetition: " + join(per_repetition);
  if (!in_range.empty())
    block.summary +=
        (block.summary.empty() ? "" : "; ") + std::string("kernels in the traced range: ") + join(in_range);
  block.json = JsonObject().add("name", row.name).raw("variants", json_array(json)).str();
  return block;
}

// The speedup chart of an operator: per other implementation, its median over fused's, by case; "null" if
// no case has both.
std::string speedup_chart_json(const OperatorGroup& g) {
  std::vector<std::string> labels, names, series;
  for (const CaseRow& row : g.rows) {
    labels.push_back(json_string(row.label));
    names.push_back(json_string(row.name));
  }
  for (const std::string& v : g.variants) {
    if (!other_implementation(v)) continue;
    std::vector<std::string> values;
    bool any = false;
    for (const CaseRow& row : g.rows) {
      const auto it = row.variants.find(v);
      if (row.fused && it != row.variants.end() && it->second->median_ns > 0) {
        values.push_back(json_number(it->second->median_ns / row.fused->median_ns));
        any = true;
      } else {
        values.push_back("null");
      }
    }
    if (any) series.push_back(JsonObject().add("variant", v).raw("values", json_array(values)).str());
  }
  if (series.empty()) return "null";
  return JsonObject()
      .raw("labels", json_array(labels))
      .raw("cases", json_array(names))
      .raw("series", json_array(series))
      .str();
}

// An operator's history: per case, per variant with two or more runs, its median (us) in each run of the
// history (null where it did not run); "null" if nothing has two points. `variants` gets the variants shown.
std::string history_json(const OperatorGroup& g, const History& history, std::vector<std::string>& variants) {
  variants.clear();
  if (history.runs.size() < 2) return "null";
  std::vector<std::string> cases;
  std::set<std::string> used;
  for (const CaseRow& row : g.rows) {
    JsonObject values;
    bool any = false;
    for (const std::string& v : g.variants) {
      std::vector<std::string> points;
      size_t count = 0;
      for (const HistoryRun& run : history.runs) {
        const auto it = run.cases.find({row.name, v});
        if (it == run.cases.end()) {
          points.push_back("null");
        } else {
          points.push_back(json_number(it->second.median_ns / 1e3));
          ++count;
        }
      }
      if (count < 2) continue;
      values.raw(v, json_array(points));
      used.insert(v);
      any = true;
    }
    if (any)
      cases.push_back(JsonObject().add("label", row.label).add("name", row.name).raw("values", values.str()).str());
  }
  if (cases.empty()) return "null";
  for (const std::string& v : g.variants)
    if (used.count(v)) variants.push_back(v);
  return JsonObject().raw("cases", json_array(cases)).str();
}

std::string operator_table(const OperatorGroup& g, size_t first_case) {
  bool any_percent = false, any_flops = false, any_memory = false, any_throughput = false;
  for (const CaseRow& row : g.rows) {
    any_percent = any_percent || (row.fused && row.fused->bandwidth_percent);
    any_flops = any_flops || (row.fused && row.fused->flops_per_s);
    any_throughput = any_throughput || (row.fused && items_per_second(*row.fused));
    for (const auto& [variant, c] : row.variants) any_memory = any_memory || peak_memory_mib(*c);
  }
  const bool any_fused = std::any_of(g.rows.begin(), g.rows.end(), [](const CaseRow& r) { return r.fused; });
  std::string out = "<div class=\"scroll\"><table class=\"sortable cases\">\n<thead><tr>" + header("Case", "", false);
  for (const std::string& v : g.variants) out += header(v, "median, Q1–Q3 (us)", true);
  if (any_fused) {
    out += header("vs baseline", "baseline / fused", true);
    out += header("vs best other", "the fastest other / fused", true);
  }
  if (any_percent) out += header("% of copy ceiling", "fused", true);
  if (any_flops) out += header("TFLOP/s", "fused", true);
  if (any_throughput) out += header("Items/s", "fused: sequences or images a second", true);
  if (any_memory) out += header("Peak memory (MiB)", "fused; baseline", true);
  out += "</tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < g.rows.size(); ++r) {
    const CaseRow& row = g.rows[r];
    out += "<tr><td><a href=\"#case-" + std::to_string(first_case + r) + "\" title=\"" + html_escape(row.name) + "\">" +
           html_escape(row.label) + "</a></td>";
    for (const std::string& v : g.variants) {
      const auto it = row.variants.find(v);
      if (it == row.variants.end()) {
        out += number_cell(std::nullopt, "");
        continue;
      }
      const CaseResult& c = *it->second;
      out += number_cell(c.median_ns / 1e3, format_microseconds(c.median_ns),
                         format_microseconds(c.q1_ns) + "–" + format_microseconds(c.q3_ns));
    }
    if (any_fused) {
      out += speedup_cell(row.vs_baseline);
      out += speedup_cell(row.vs_best_other, row.best_other);
    }
    if (any_percent) {
      const auto p = row.fused ? row.fused->bandwidth_percent : std::nullopt;
      out += number_cell(p, p ? fixed(*p, 1) : "");
    }
    if (any_flops) {
      const auto f = row.fused ? row.fused->flops_per_s : std::nullopt;
      out += number_cell(f ? std::optional<double>(*f * 1e-12) : std::nullopt, f ? fixed(*f * 1e-12, 2) : "");
    }
    if (any_throughput) {
      // (value_or: GCC 12 takes the optional's payload for uninitialized under -Werror)
      const double t = row.fused ? items_per_second(*row.fused).value_or(NAN) : NAN;
      out +=
          number_cell(std::isfinite(t) ? std::optional<double>(t) : std::nullopt, std::isfinite(t) ? fixed(t, 0) : "");
    }
    if (any_memory) {
      const auto mib = [&](const char* variant) -> std::optional<double> {
        const auto it = row.variants.find(variant);
        return it == row.variants.end() ? std::nullopt : peak_memory_mib(*it->second);
      };
      const auto fused = mib("fused"), baseline = mib("baseline");
      out += number_cell(fused, fused ? fixed(*fused, 0) : "", baseline ? fixed(*baseline, 0) : "");
    }
    out += "</tr>\n";
  }
  return out + "</tbody>\n</table></div>\n";
}

// The table of operators: per operator its cases and fused's speedups, summed up.
std::string overview_table(const std::vector<OperatorGroup>& groups) {
  std::string out = "<table class=\"sortable\">\n<thead><tr>" + header("Operator", "", false) +
                    header("Cases", "", true) + header("fused vs baseline", "geometric mean, min–max", true) +
                    header("fused vs best other", "geometric mean, min–max", true) +
                    header("fused fastest", "cases", true) + header("Variants", "", false) + "</tr></thead>\n<tbody>\n";
  for (size_t i = 0; i < groups.size(); ++i) {
    const OperatorGroup& g = groups[i];
    std::vector<double> vs_baseline, vs_best;
    size_t fastest = 0, compared = 0;
    for (const CaseRow& row : g.rows) {
      if (row.vs_baseline) vs_baseline.push_back(*row.vs_baseline);
      if (row.vs_best_other) {
        vs_best.push_back(*row.vs_best_other);
        ++compared;
        if (*row.vs_best_other > 1) ++fastest;
      }
    }
    const auto summary = [](const std::vector<double>& v) {
      if (v.empty()) return speedup_cell(std::nullopt);
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return speedup_cell(geometric_mean(v), fixed(*lo, 2) + "–" + fixed(*hi, 2) + "x");
    };
    std::string variants;
    for (const std::string& v : g.variants) variants += (variants.empty() ? "" : ", ") + v;
    out += "<tr><td><a href=\"#op-" + std::to_string(i) + "\">" + html_escape(g.op) + "</a></td>" +
           number_cell(static_cast<double>(g.rows.size()), std::to_string(g.rows.size())) + summary(vs_baseline) +
           summary(vs_best) +
           (compared ? number_cell(static_cast<double>(fastest) / static_cast<double>(compared),
                                   std::to_string(fastest) + " of " + std::to_string(compared))
                     : number_cell(std::nullopt, "")) +
           element("td", variants) + "</tr>\n";
  }
  return out + "</tbody>\n</table>\n";
}

std::string run_label(const HistoryRun& r) {
  std::string label = r.run.git_commit.empty() ? "run " + std::to_string(r.run.id) : r.run.git_commit.substr(0, 7);
  // "2026-11-27T08:47:25Z" -> "11-27 08:47"
  if (r.run.started_at.size() >= 16)
    label += " " + r.run.started_at.substr(5, 5) + " " + r.run.started_at.substr(11, 5);
  return label;
}

std::string history_runs_json(const History& history) {
  std::vector<std::string> runs;
  for (const HistoryRun& r : history.runs) {
    runs.push_back(JsonObject()
                       .add("label", run_label(r))
                       .add("title", run_title(r.run) + (r.store.empty() ? "" : " in " + r.store) + ", started " +
                                         r.run.started_at + (r.current ? " (this report)" : ""))
                       .add("current", r.current)
                       .str());
  }
  return json_array(runs);
}

std::string history_runs_table(const History& history) {
  std::string out = "<details><summary>The runs in the history charts: " + std::to_string(history.runs.size()) +
                    "</summary>\n<table>\n<thead><tr><th>Label</th><th>Run</th><th>Started (UTC)</th><th>Status</th>"
                    "<th class=\"num\">Cases</th><th>Store</th></tr></thead>\n<tbody>\n";
  for (const HistoryRun& r : history.runs) {
    out += "<tr>" + element("td", run_label(r)) +
           element("td", run_title(r.run) + (r.current ? " (this report)" : "")) + element("td", r.run.started_at) +
           element("td", r.run.status) + element("td", std::to_string(r.cases.size()), "num") +
           element("td", r.store, "name") + "</tr>\n";
  }
  return out + "</tbody>\n</table>\n</details>\n";
}

// The whole run's kernels for the chart that runs without cases show.
std::string run_kernels_json(const RunReport& report, bool shown, std::string& other) {
  std::vector<std::string> kernels;
  double other_percent = 0;
  size_t count = 0;
  if (shown) {
    std::vector<std::string> names;
    for (size_t i = 0; i < report.kernels.size() && i < kTopKernels; ++i) names.push_back(report.kernels[i].name);
    const std::vector<std::string> labels = distinct_short_names(names);
    for (size_t i = 0; i < report.kernels.size(); ++i) {
      const profiler::KernelStats& k = report.kernels[i];
      if (i >= kTopKernels) {
        other_percent += k.time_percent;
        ++count;
        continue;
      }
      kernels.push_back(JsonObject().add("name", k.name).add("short", labels[i]).add("percent", k.time_percent).str());
    }
  }
  other = JsonObject().add("count", count).add("percent", other_percent).str();
  return json_array(kernels);
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string script_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.substr(i, 2) == "</") {
      out += "<\\/";
      ++i;
    } else if (text.substr(i, 4) == "<!--") {
      out += "<\\u0021--";
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string report_html(const RunReport& report, const History& history) {
  const RunInfo& run = report.run;
  const std::string title = run_title(run);
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n" +
      element("title", title) + "\n<style>" + std::string(kHtmlStyle) + "</style>\n</head>\n<body>\n" +
      element("h1", title) + "\n<table class=\"meta\">\n";
  for (const auto& [field, value] : run_metadata(report))
    out += "<tr>" + element("th", field) + element("td", value, field == "Command line" ? "name" : "") + "</tr>\n";
  out += "</table>\n";
  if (run.dropped_records > 0) {
    out += element("p",
                   std::to_string(run.dropped_records) +
                       " records were dropped while tracing: the kernel and range tables undercount.",
                   "warning") +
           "\n";
  }

  const std::vector<OperatorGroup> groups = group_by_operator(report.cases);
  KernelNames names(report.kernels);
  std::vector<std::string> ops_json, cases_json;
  if (groups.empty()) {
    out += element("h2", "Cases") + "\n" + element("p", "No cases in this run.", "empty") + "\n";
  } else {
    out += element("h2", "Operators") + "\n" +
           element("p",
                   "A speedup is another variant's median over fused's: above 1, fused is faster. The best other is "
                   "the fastest variant that is not fusekit's (fused, fused:*) or a yardstick (reference:*). Click a "
                   "column's header to sort, an operator to go to its cases.",
                   "note") +
           "\n" + overview_table(groups);
    if (history.runs.size() >= 2) out += history_runs_table(history);
    size_t first_case = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const OperatorGroup& g = groups[i];
      const std::string id = std::to_string(i);
      const std::string chart = speedup_chart_json(g);
      std::vector<std::string> history_variants;
      const std::string history_data = history_json(g, history, history_variants);
      ops_json.push_back(JsonObject().raw("chart", chart).raw("history", history_data).str());

      std::string variants;
      for (const std::string& v : g.variants) variants += (variants.empty() ? "" : ", ") + v;
      out += "<section id=\"op-" + id + "\">\n" + element("h2", g.op) + "\n" +
             element("p",
                     std::to_string(g.rows.size()) + (g.rows.size() == 1 ? " case" : " cases") +
                         "; variants: " + variants + ". Click a case for its kernels.",
                     "note") +
             "\n";
      if (chart != "null") {
        const int height = 220 + 4 * static_cast<int>(std::min<size_t>(g.rows.size(), 20));
        out += element("h3", "Speedup of fused by case") + "\n" + canvas("speedup-" + id, height, "small-chart");
      }
      out += operator_table(g, first_case);
      if (history_data != "null") {
        out += element("h3", "Median over runs") +
               "\n<div class=\"history-controls\"><label>Variant <select id=\"history-variant-" + id + "\">";
        const bool has_fused =
            std::find(history_variants.begin(), history_variants.end(), "fused") != history_variants.end();
        for (size_t v = 0; v < history_variants.size(); ++v) {
          const bool selected = has_fused ? history_variants[v] == "fused" : v == 0;
          out += "<option value=\"" + html_escape(history_variants[v]) + "\"" + (selected ? " selected" : "") + ">" +
                 html_escape(history_variants[v]) + "</option>";
        }
        out += "</select></label><label>Scale <select id=\"history-scale-" + id +
               "\"><option value=\"relative\" selected>relative to this run</option><option value=\"absolute\">median "
               "(us)</option></select></label></div>\n" +
               canvas("history-" + id, 320, "small-chart");
      }
      out += element("h3", "Kernel time shares by case") + "\n";
      size_t untraced = 0;
      for (size_t r = 0; r < g.rows.size(); ++r) {
        const size_t j = first_case + r;
        const KernelBlock block = kernel_block(g.rows[r], g.variants, report, names);
        cases_json.push_back(block.json);
        if (block.empty) {
          ++untraced;
          continue;
        }
        out += "<details class=\"case\" id=\"case-" + std::to_string(j) + "\" data-case=\"" + std::to_string(j) +
               "\"><summary><span class=\"name\">" + html_escape(g.rows[r].label) + "</span> <small class=\"note\">" +
               html_escape(block.summary) + "</small></summary><div class=\"kernels\"></div></details>\n";
      }
      if (untraced > 0) {
        out += element("p",
                       std::to_string(untraced) + (untraced == 1 ? " case has" : " cases have") +
                           " no traced kernels in this run.",
                       "empty") +
               "\n";
      }
      out += "</section>\n";
      first_case += g.rows.size();
    }
  }

  std::string other_kernels;
  const std::string run_kernels = run_kernels_json(report, report.cases.empty(), other_kernels);
  if (report.cases.empty()) {
    const size_t kernel_bars = std::min(report.kernels.size(), kTopKernels + 1);
    out += element("h2", "Kernel time shares") + "\n" +
           chart_or_line("chart-kernels", !report.kernels.empty(), 60 + 24 * static_cast<int>(kernel_bars),
                         "No kernels were traced in this run.");
    const auto section = [&](std::string_view heading, const ReportTable& table, std::string_view none) {
      out +=
          element("h2", heading) + "\n" + (table.rows.empty() ? element("p", none, "empty") + "\n" : html_table(table));
    };
    section("Kernels", kernel_table(report), "No kernels were traced in this run.");
    section("Ranges", range_table(report), "No NVTX ranges were traced in this run.");
  } else {
    out += element("h2", "The whole run") + "\n";
    const ReportTable kernels = kernel_table(report);
    out += "<details><summary>Kernels of every case and variant together (top " + std::to_string(kernels.rows.size()) +
           " of " + std::to_string(report.kernels.size()) + ")</summary>\n" +
           (kernels.rows.empty() ? element("p", "No kernels were traced in this run.", "empty") + "\n"
                                 : html_table(kernels)) +
           "</details>\n";
    const ReportTable ranges = range_table(report);
    out += "<details><summary>NVTX ranges (" + std::to_string(ranges.rows.size()) + ")</summary>\n" +
           (ranges.rows.empty() ? element("p", "No NVTX ranges were traced in this run.", "empty") + "\n"
                                : html_table(ranges)) +
           "</details>\n";
  }

  const std::string data = JsonObject()
                               .raw("ops", json_array(ops_json))
                               .raw("cases", json_array(cases_json))
                               .raw("names", names.json())
                               .raw("runs", history_runs_json(history))
                               .raw("kernels", run_kernels)
                               .raw("other_kernels", other_kernels)
                               .str();
  out += "<script type=\"application/json\" id=\"fusekit-data\">" + script_safe(data) + "</script>\n";
  out += "<script>\n" + script_safe(chartjs_source()) + "\n</script>\n";
  out += "<script>" + script_safe(kHtmlScript) + "</script>\n</body>\n</html>\n";
  return out;
}

std::string index_html(const std::vector<IndexEntry>& entries) {
  const std::string title = "fusekit reports";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n" +
      element("title", title) + "\n<style>" + std::string(kHtmlStyle) + "</style>\n</head>\n<body>\n" +
      element("h1", title) + "\n";
  if (entries.empty()) return out + element("p", "No reports.") + "\n</body>\n</html>\n";
  out +=
      "<table>\n<tr><th>Report</th><th>GPU</th><th>Commit</th><th>Started (UTC)</th><th>Status</th>"
      "<th>Cases</th><th>Variants</th><th>Command line</th></tr>\n";
  for (const IndexEntry& e : entries) {
    out += "<tr><td><a href=\"" + html_escape(e.href) + "\">" + html_escape(run_title(e.run)) + "</a></td>" +
           element("td", e.run.gpu_name) + element("td", e.run.git_commit.substr(0, 7)) +
           element("td", e.run.started_at) + element("td", e.run.status) + element("td", std::to_string(e.cases)) +
           element("td", std::to_string(e.variants)) + element("td", e.run.command_line, "name") + "</tr>\n";
  }
  return out + "</table>\n</body>\n</html>\n";
}

}  // namespace fusekit::reports
