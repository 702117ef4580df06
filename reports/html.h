// The run report as one self-contained HTML page.
//
// A run of cases shows its metadata, a table of operators (fused's speedups summed up), then a section per
// operator (or model): a chart of fused's speedup over each other variant by case, a sortable table with a
// row per case and the variants side by side (median and Q1-Q3; the speedup over the libtorch baseline and
// over the fastest other variant, named; fused's share of the copy ceiling and TFLOP/s), with a history,
// a chart of each case's median over the runs of the history, and per case a collapsible block of its
// kernel time shares, a stacked bar per variant (reports/case_kernels.h; names from
// reports/kernel_names.h). The whole run's kernel and range tables follow, folded. A run without cases
// (a traced program) shows the whole run's kernel time shares and its kernel and range tables.
//
// The page fetches nothing when viewed: Chart.js is inlined from the copy embedded in the binary, the data
// travels as JSON in a <script type="application/json"> element, and a Content-Security-Policy forbids every
// other source, so a page that does reach for the network shows it in the browser's console.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "reports/history.h"
#include "reports/run_report.h"

namespace fusekit::reports {

// `history`: the runs whose medians the history charts show (reports/history.h); none with fewer than two.
std::string report_html(const RunReport& report, const History& history = {});

// One line of the index page: a report and the run it shows.
struct IndexEntry {
  std::string href;  // the report's address, relative to the index page
  RunInfo run;
  size_t cases = 0;
  size_t variants = 0;
};

// The index page of a folder of reports: per report its title (run_title), suite or command, GPU,
// commit, date and status, with a link; self-contained like the reports.
std::string index_html(const std::vector<IndexEntry>& entries);

// & < > " ' as character references.
std::string html_escape(std::string_view text);

// Text made safe to sit inside a <script> element: "</" becomes "<\/" and "<!--" becomes "<\u0021--".
// Both spellings mean the same inside a JSON or JavaScript string, so JSON stays valid.
std::string script_safe(std::string_view text);

}  // namespace fusekit::reports
