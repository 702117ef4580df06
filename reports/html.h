// The run report as one self-contained HTML page: metadata, three charts, and the Markdown report's tables.
//
// The page fetches nothing when viewed: Chart.js is inlined from the copy embedded in the binary, the data
// travels as JSON in a <script type="application/json"> element, and a Content-Security-Policy forbids every
// other source, so a page that does reach for the network shows it in the browser's console.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "reports/run_report.h"

namespace fusekit::reports {

std::string report_html(const RunReport& report);

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
