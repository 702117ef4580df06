#include "reports/html.h"

#include <algorithm>
#include <vector>

#include "profiler/records.h"
#include "reports/chartjs.h"
#include "reports/json.h"
#include "reports/markdown.h"

namespace fusekit::reports {
namespace {

constexpr std::string_view kStyle = R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2125; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #d8dde3; }
table { border-collapse: collapse; margin: 0.5rem 0; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #e4e8ec; vertical-align: top; text-align: left; }
th { background: #f3f5f7; }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.name { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px;
        word-break: break-all; }
td.name { min-width: 40ch; }
table.meta th { text-align: left; white-space: nowrap; }
.chart { position: relative; width: 100%; }
.note, .empty { color: #5b6570; }
.warning { background: #fff4e5; border-left: 4px solid #f0a020; padding: 0.5rem 0.8rem; }
)CSS";

// Reads the JSON data element and draws the charts whose canvas the page holds.
constexpr std::string_view kScript = R"JS(
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('fusekit-data').textContent);
  const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
                   '#9c755f', '#bab0ac'];
  Chart.defaults.animation = false;
  Chart.defaults.font.family = 'system-ui, sans-serif';
  const unique = (values) => values.filter((v, i) => values.indexOf(v) === i);

  // One group of bars per case name, one dataset per variant; value(c) is null where a case has no value.
  function grouped(cases, value) {
    const names = unique(cases.map((c) => c.name));
    const variants = unique(cases.map((c) => c.variant));
    const datasets = variants.map((variant, i) => ({
      label: variant,
      backgroundColor: palette[i % palette.length],
      skipNull: true,
      data: names.map((name) => {
        const c = cases.find((c) => c.name === name && c.variant === variant);
        return c === undefined ? null : value(c);
      }),
    }));
    return {labels: names, datasets: datasets};
  }

  function bars(id, chartData, options) {
    const canvas = document.getElementById(id);
    if (canvas === null) return;
    new Chart(canvas, {type: 'bar', data: chartData, options: Object.assign({
      responsive: true, maintainAspectRatio: false,
    }, options)});
  }

  const axis = (title, extra) => Object.assign({title: {display: true, text: title}}, extra || {});
  const medians = data.cases.map((c) => c.median_us).filter((v) => v > 0);
  const logScale = medians.length > 0 && Math.max(...medians) / Math.min(...medians) > 100;
  bars('chart-medians', grouped(data.cases, (c) => c.median_us), {
    scales: {y: axis('median (us)' + (logScale ? ', log scale' : ''), logScale ? {type: 'logarithmic'} : {})},
    plugins: {tooltip: {callbacks: {label: (item) => item.dataset.label + ': ' + item.parsed.y.toFixed(3) + ' us'}}},
  });

  const compared = data.cases.filter((c) => c.variant !== 'baseline' && c.speedup !== null);
  bars('chart-speedups', grouped(compared, (c) => c.speedup), {
    scales: {y: axis('speedup over baseline (x)', {beginAtZero: true})},
    plugins: {tooltip: {callbacks: {label: (item) => item.dataset.label + ': ' + item.parsed.y.toFixed(2) + 'x'}}},
  });

  const kernels = data.kernels.slice();
  if (data.other_kernels.count > 0) {
    kernels.push({name: data.other_kernels.count + ' other kernels', short_name: 'other',
                  percent: data.other_kernels.percent});
  }
  // Short names, cut to 40 characters, numbered where several kernels share one; the tooltip
  // shows the full name.
  const seen = {};
  const labels = kernels.map((k) => {
    const base = k.short_name.length > 40 ? k.short_name.slice(0, 39) + '\u2026' : k.short_name;
    seen[base] = (seen[base] || 0) + 1;
    return seen[base] > 1 ? base + ' #' + seen[base] : base;
  });
  bars('chart-kernels', {
    labels: labels,
    datasets: [{label: 'share of kernel time (%)', data: kernels.map((k) => k.percent),
                backgroundColor: palette[0]}],
  }, {
    indexAxis: 'y',
    scales: {x: axis('share of kernel time (%)', {beginAtZero: true})},
    plugins: {legend: {display: false}, tooltip: {callbacks: {
      title: (items) => kernels[items[0].dataIndex].name,
      label: (item) => item.parsed.x.toFixed(1) + ' % of kernel time',
    }}},
  });
})();
)JS";

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

std::string chart_or_line(std::string_view id, bool has_data, int height_px, std::string_view none) {
  if (!has_data) return element("p", none, "empty") + "\n";
  return "<div class=\"chart\" style=\"height: " + std::to_string(height_px) + "px\"><canvas id=\"" + std::string(id) +
         "\"></canvas></div>\n";
}

// What the charts draw, and only that: the tables are already in the page as HTML.
std::string chart_data(const RunReport& report) {
  std::vector<std::string> cases, kernels;
  for (const CaseResult& c : report.cases) {
    cases.push_back(JsonObject()
                        .add("name", c.info.name)
                        .add("variant", c.info.variant)
                        .add("median_us", c.median_ns / 1e3)
                        .add("speedup", c.speedup)
                        .str());
  }
  double other_percent = 0;
  for (size_t i = 0; i < report.kernels.size(); ++i) {
    const profiler::KernelStats& k = report.kernels[i];
    if (i >= kTopKernels) {
      other_percent += k.time_percent;
      continue;
    }
    kernels.push_back(JsonObject()
                          .add("name", k.name)
                          .add("short_name", profiler::short_kernel_name(k.name))
                          .add("percent", k.time_percent)
                          .str());
  }
  const size_t other_count = report.kernels.size() - kernels.size();
  return JsonObject()
      .raw("cases", json_array(cases))
      .raw("kernels", json_array(kernels))
      .raw("other_kernels", JsonObject().add("count", other_count).add("percent", other_percent).str())
      .str();
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

std::string report_html(const RunReport& report) {
  const RunInfo& run = report.run;
  const std::string title = run_title(run);
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n" +
      element("title", title) + "\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n" +
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

  const bool any_speedup = std::any_of(report.cases.begin(), report.cases.end(), [](const CaseResult& c) {
    return c.info.variant != "baseline" && c.speedup.has_value();
  });
  const size_t kernel_bars = std::min(report.kernels.size(), kTopKernels + 1);
  out += element("h2", "Case medians") + "\n" +
         chart_or_line("chart-medians", !report.cases.empty(), 360, "No cases in this run.");
  out += element("h2", "Speedups over the baseline") + "\n" +
         chart_or_line("chart-speedups", any_speedup, 320, "No case has a speedup over a baseline in this run.");
  out += element("h2", "Kernel time shares") + "\n" +
         chart_or_line("chart-kernels", !report.kernels.empty(), 60 + 24 * static_cast<int>(kernel_bars),
                       "No kernels were traced in this run.");

  const auto section = [&](std::string_view heading, const ReportTable& table, std::string_view none) {
    out +=
        element("h2", heading) + "\n" + (table.rows.empty() ? element("p", none, "empty") + "\n" : html_table(table));
  };
  section("Cases", case_table(report), "No cases in this run.");
  section("Kernels", kernel_table(report), "No kernels were traced in this run.");
  section("Ranges", range_table(report), "No NVTX ranges were traced in this run.");

  out += "<script type=\"application/json\" id=\"fusekit-data\">" + script_safe(chart_data(report)) + "</script>\n";
  out += "<script>\n" + script_safe(chartjs_source()) + "\n</script>\n";
  out += "<script>" + script_safe(kScript) + "</script>\n</body>\n</html>\n";
  return out;
}

std::string index_html(const std::vector<IndexEntry>& entries) {
  const std::string title = "fusekit reports";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n" +
      element("title", title) + "\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n" +
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
