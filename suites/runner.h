// The runner: times cases and traces them, the same way for every suite.
//
// Per case: warm-up; R timed samples with the tracer off, each a batch of back-to-back repetitions
// between two CUDA events, long enough that the events' own cost is a small part of it (every
// sample, the batch's time per repetition, is stored for medians, spreads and the gate's
// significance test). Once every case is timed, each is set up again for T traced
// repetitions inside NVTX ranges "<case> [<variant>]" > "rep", whose records give the kernel shares.
// A case rotates through its own input sets (sized by the case to exceed L2) using the repetition
// index, so timings are of memory, not of cache.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "store/run_records.h"
#include "store/store.h"

namespace fusekit::suites {

struct Case {
  store::CaseInfo info;
  // Enqueues one repetition on `stream`; `rep` selects the input set.
  std::function<void(cudaStream_t stream, int rep)> run;
  // Optional: called once before the first repetition and after the last, so that a suite of
  // many cases holds the device memory of one case at a time.
  std::function<void(cudaStream_t stream)> setup;
  std::function<void()> release;
  // Optional: called once after the timed samples (before the case is released), its numbers
  // stored with the case (store::CaseMetric), e.g. the peak device memory of a training step.
  std::function<std::vector<store::CaseMetric>()> metrics = nullptr;
};

struct RunnerOptions {
  int warmup = 10;  // repetitions; then more until warmup_ms of device time has passed
  int repetitions = 50;
  int traced_repetitions = 5;
  // The warm-up lasts at least this long on the device (as triton.testing.do_bench's 25 ms), so that
  // a case is timed in the steady state whatever ran before it: after the BERT-large AdamW baseline
  // (180 ms of full-bandwidth traffic) the Swin-T trainer step, 290 us, ran its first 9 ms 15% slow
  // with 5 warm-up repetitions; alone it ran at speed from its third repetition (H100).
  double warmup_ms = 25;
  // Each timed sample runs back-to-back repetitions between one pair of events until it spans at
  // least this much device time (estimated from the warm-up); 0: one repetition a sample. A pair
  // of events around every repetition adds the events' own cost to each: on the H100 a cudaMemcpy
  // of 38.5 MB (Swin-T stage 1's window partition) took 26.9 us in its CUPTI record and 30.1 us
  // between two events (median, events around each of 30 queued repetitions).
  double sample_us = 500;
};

// Repetitions a sample: enough for `sample_us` at `per_rep_ms` a repetition, 1..kMaxSampleBatch.
constexpr int kMaxSampleBatch = 1000;
int sample_batch(double sample_us, double per_rep_ms);

// Runs and records every case into `run` of `store`. Returns the number of dropped trace records.
uint64_t run_cases(store::Store& store, int64_t run, const std::vector<Case>& cases, const RunnerOptions& options);

// Median device-to-device copy bandwidth (bytes read + bytes written per second) over `bytes`-sized buffers.
double measure_copy_ceiling(size_t bytes, int repetitions);

}  // namespace fusekit::suites
