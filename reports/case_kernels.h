// The kernels of each case's traced repetitions, per variant: what the HTML report's per-case kernel time
// shares show.
//
// The runner traces a case's repetitions inside one NVTX range "<case> [<variant>]", each repetition in a
// nested range "rep" (suites/runner.h); the peers (scripts/peers/ops.py) open the case's range and mark no
// repetitions. A kernel belongs to a case when the range it is attributed to is that case's range or is
// nested in it (profiler/attribution.h), or else when another thread of the same process launched it while
// the case's range was open: autograd launches the backward pass from its own threads, whose launches
// attribution by thread places in no case.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "profiler/attribution.h"
#include "profiler/records.h"

namespace fusekit::reports {

struct KernelTime {
  std::string name;
  uint64_t total_ns = 0;
  uint64_t instances = 0;
};

struct VariantKernels {
  uint64_t kernel_ns = 0;           // every kernel of the case's range(s), summed
  uint64_t launches = 0;            // how many kernels ran
  uint64_t repetitions = 0;         // "rep" ranges inside; 0 where the variant marks none (the peers)
  std::vector<KernelTime> kernels;  // by total time, largest first (then by name)
};

// Per (case name, variant) of `cases` whose range "<name> [<variant>]" the trace holds: its kernels. A
// range that occurs more than once (a run traced twice) adds up.
std::map<std::pair<std::string, std::string>, VariantKernels> case_kernels(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases);

// A case's kernels per traced repetition: the samples of the gate's per-kernel test.
struct RepetitionKernels {
  uint64_t repetitions = 0;  // "rep" ranges nested in the case's range(s); 0 where the variant marks none
  // Per kernel name, one value per repetition (in the order the repetitions started): the summed duration
  // of that kernel's instances in it, 0 where it did not run in that repetition.
  std::map<std::string, std::vector<double>> samples_ns;
};

// Per (case name, variant) of `cases` whose range "<name> [<variant>]" the trace holds. A kernel belongs
// to the repetition whose "rep" range its attributed range is (or is nested in) below the case's range;
// a kernel that attribution places in no repetition (launched by another thread of the process, as
// autograd does) belongs to the repetition of a case that was open in its process when it was launched.
// Kernels of the case's range outside every repetition are left out.
std::map<std::pair<std::string, std::string>, RepetitionKernels> case_repetition_kernels(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases);

// The same per-repetition samples keyed by where the kernels ran instead of by kernel: the NVTX
// ranges nested below the repetition's "rep" range, outermost first, cut to `depth` names and joined
// by " / " ("bert.step / bert.forward"); kernels in no range below "rep" go to "(rep)". A range's
// sample per repetition is the GPU time of the kernels attributed to it or to ranges nested in it.
std::map<std::pair<std::string, std::string>, RepetitionKernels> case_repetition_ranges(
    const profiler::Trace& trace, const profiler::Attribution& attribution,
    const std::set<std::pair<std::string, std::string>>& cases, int depth);

}  // namespace fusekit::reports
