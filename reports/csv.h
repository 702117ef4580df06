// CSV tables of a run: its cases, its kernels (the columns of `nsys stats` cuda_gpu_kern_sum) and its ranges.
//
// Fields are quoted as RFC 4180 says (a field holding a comma, quote, CR or LF is quoted, quotes doubled), but
// lines end in "\n", as `nsys stats --format csv` writes them, so shell tools see no stray "\r".
#pragma once

#include <string>

#include "reports/run_report.h"

namespace fusekit::reports {

// run_id,name,op,shape,dtype,variant,samples,median_us,q1_us,q3_us,min_us,max_us,speedup,bytes,bandwidth_GBps,
// bandwidth_percent,flops,tflops; an absent optional or a non-finite number is an
// empty cell. Times to the nanosecond.
std::string cases_csv(const RunReport& report);
// One row per case, the variants as columns: run_id,name,op,shape,dtype,bytes, then <variant>_median_us
// for each variant of the run (fused first, baseline second, the others in name order), then
// fused_vs_baseline (baseline median / fused median), best_other (the fastest variant that is not
// fusekit's: not fused or fused:<something>) and fused_vs_best_other. A variant a case lacks is an empty cell.
std::string cases_wide_csv(const RunReport& report);
// "Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name".
std::string kernels_csv(const RunReport& report);
// "Wall (ns)","GPU Busy (ns)","Idle (%)","Instances","Kernels","Kernel Time (ns)","Name".
std::string ranges_csv(const RunReport& report);
// A row per case and variant with traced repetitions (report.case_breakdowns):
// run_id,name,variant,repetitions,kernels,gpu_us (all of the case's traced repetitions),gpu_us_per_rep,
// then for every category (profiler's
// category_key: gemm, attention, ..., copy_cast, communication, other) <key>_percent and
// <key>_us_per_rep. Per-repetition cells are empty where the case range marks no repetitions.
std::string categories_csv(const RunReport& report);
// A row per case, variant and nested range path: run_id,name,variant,range ("a > b > c"),depth,
// percent (of the case's GPU time, ranges nested deeper included),us_per_rep.
std::string step_ranges_csv(const RunReport& report);

}  // namespace fusekit::reports
