#include "reports/terminal.h"

#include <algorithm>
#include <cstdio>

#include "reports/markdown.h"

namespace fusekit::reports {

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string aligned_table(const std::vector<std::vector<std::string>>& rows, size_t left_from) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(width[c] - cell.size(), ' ');
      if (c > 0) line += "  ";
      line += c < left_from ? pad + cell : (c + 1 == rows[r].size() ? cell : cell + pad);
    }
    out += line + "\n";
    if (r == 0) {
      std::string rule;
      for (size_t c = 0; c < width.size(); ++c) rule += (c ? "  " : "") + std::string(width[c], '-');
      out += rule + "\n";
    }
  }
  return out;
}

std::string kernel_table_text(const std::vector<profiler::KernelStats>& kernels, size_t top) {
  std::vector<std::vector<std::string>> rows = {{"Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)",
                                                 "Min (ns)", "Max (ns)", "StdDev (ns)", "Name"}};
  for (size_t i = 0; i < kernels.size() && i < top; ++i) {
    const auto& k = kernels[i];
    rows.push_back({format_fixed(k.time_percent, 1), std::to_string(k.total_ns), std::to_string(k.instances),
                    format_fixed(k.avg_ns, 1), format_fixed(k.med_ns, 1), std::to_string(k.min_ns),
                    std::to_string(k.max_ns), format_fixed(k.stddev_ns, 1), k.name});
  }
  std::string out = aligned_table(rows, 8);
  if (kernels.size() > top) out += "(" + std::to_string(kernels.size() - top) + " more kernels)\n";
  return out;
}

std::string range_table_text(const std::vector<profiler::RangeStats>& ranges, size_t top) {
  std::vector<std::vector<std::string>> rows = {
      {"Wall (us)", "GPU extent (us)", "GPU busy (us)", "Idle (%)", "Instances", "Kernels", "Name"}};
  for (size_t i = 0; i < ranges.size() && i < top; ++i) {
    const auto& r = ranges[i];
    rows.push_back({format_fixed(r.wall_ns / 1e3, 1), format_fixed(r.extent_ns / 1e3, 1),
                    format_fixed(r.busy_ns / 1e3, 1), format_fixed(100 * r.idle_fraction, 1),
                    std::to_string(r.instances), std::to_string(r.kernels), r.name});
  }
  std::string out = aligned_table(rows, 6);
  if (ranges.size() > top) out += "(" + std::to_string(ranges.size() - top) + " more ranges)\n";
  // Launches return before their kernels run, so a range's kernels can outlast it: busy time above
  // wall time is expected, and the legend says so where it happens.
  const bool outlasted =
      std::any_of(ranges.begin(), ranges.begin() + static_cast<std::ptrdiff_t>(std::min(top, ranges.size())),
                  [](const profiler::RangeStats& r) { return r.busy_ns > r.wall_ns; });
  out +=
      "Wall: push to pop on the CPU. GPU extent: push to the end of the range's last kernel. GPU busy: the union "
      "of its kernels' intervals. Idle: 1 - busy / extent.\n";
  if (outlasted) {
    out +=
        "GPU busy above wall: the kernels launched in the range ran on after it closed (launches are "
        "asynchronous).\n";
  }
  return out;
}

std::string case_table_text(const std::vector<CaseResult>& cases) {
  std::vector<std::vector<std::string>> rows = {
      {"Median (us)", "Q1 (us)", "Q3 (us)", "Samples", "Speedup", "GB/s", "% ceiling", "Variant", "Case"}};
  for (const CaseResult& c : cases) {
    rows.push_back({format_fixed(c.median_ns / 1e3, 2), format_fixed(c.q1_ns / 1e3, 2), format_fixed(c.q3_ns / 1e3, 2),
                    std::to_string(c.samples_ns.size()), c.speedup ? format_fixed(*c.speedup, 2) + "x" : "-",
                    c.bandwidth_bytes_per_s ? format_fixed(*c.bandwidth_bytes_per_s / 1e9, 1) : "-",
                    c.bandwidth_percent ? format_fixed(*c.bandwidth_percent, 1) : "-", c.info.variant, c.info.name});
  }
  return aligned_table(rows, 7);
}

namespace {

std::string report_table_text(const ReportTable& table) {
  std::vector<std::vector<std::string>> rows = {table.header};
  rows.insert(rows.end(), table.rows.begin(), table.rows.end());
  return aligned_table(rows, table.text_from);
}

// `text` broken into lines of at most `width` characters at spaces.
std::string wrapped(const std::string& text, size_t width) {
  std::string out, line;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find_first_of(" \n", begin);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(begin, end - begin);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    if (!word.empty()) line += (line.empty() ? "" : " ") + word;
    begin = end + 1;
  }
  return line.empty() ? out : out + line + "\n";
}

}  // namespace

std::string category_table_text(const std::vector<CaseBreakdown>& breakdowns, profiler::RangeProjection projection) {
  return report_table_text(category_table(breakdowns)) + wrapped(category_legend(projection), 110);
}

std::string nested_range_tables_text(const std::vector<CaseBreakdown>& breakdowns) {
  std::string out;
  for (const TitledTable& t : nested_range_tables(breakdowns, true)) {
    out += (out.empty() ? "" : "\n") + t.title + ":\n\n" + report_table_text(t.table);
  }
  return out;
}

std::string gate_table_text(const GateResult& result) {
  std::string out;
  for (const std::string& w : result.condition_warnings) out += "warning: " + w + "\n";
  out += aligned_table(gate_table_rows(result, false), 5) + gate_verdict_counts(result);
  for (const std::string& c : result.only_in_baseline) out += "only in baseline:  " + c + "\n";
  for (const std::string& c : result.only_in_candidate) out += "only in candidate: " + c + "\n";
  for (const std::string& c : result.throttled_cases) out += "throttled: " + c + "\n";
  if (result.kernel_rows_requested) {
    for (const CaseKernelGate& gate : result.kernels) {
      out += "\n" + gate.name + " [" + gate.variant + "], " + std::to_string(gate.baseline_repetitions) + "/" +
             std::to_string(gate.candidate_repetitions) + " repetitions:\n";
      const std::string note = gate_kernel_note(gate);
      out += note.empty() ? aligned_table(gate_kernel_rows(gate, gate.rows.size(), false), 6) : "  " + note + "\n";
    }
  }
  for (const CaseKernelGate& gate : result.ranges) {
    out += "\n" + gate.name + " [" + gate.variant + "], NVTX ranges, " + std::to_string(gate.baseline_repetitions) +
           "/" + std::to_string(gate.candidate_repetitions) + " repetitions:\n";
    const std::string note = gate_kernel_note(gate);
    out +=
        note.empty() ? aligned_table(gate_kernel_rows(gate, gate.rows.size(), false, "Range"), 6) : "  " + note + "\n";
  }
  return out;
}

}  // namespace fusekit::reports
