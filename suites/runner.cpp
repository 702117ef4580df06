#include "suites/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "profiler/cupti_tracer.h"
#include "profiler/gpu_conditions.h"
#include "profiler/range.h"
#include "profiler/summary.h"
#include "suites/interrupt.h"

namespace fusekit::suites {
namespace {

class Events {
 public:
  Events() {
    FUSEKIT_CUDA_CHECK(cudaEventCreate(&start_));
    FUSEKIT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// Undoes a step on every way out of a case, exceptions included: the tracer stopped, the case's
// memory released, the stream destroyed.
template <class F>
class OnExit {
 public:
  explicit OnExit(F f) : f_(std::move(f)) {}
  OnExit(const OnExit&) = delete;
  OnExit& operator=(const OnExit&) = delete;
  ~OnExit() { f_(); }

 private:
  F f_;
};

// More warm-up repetitions until `milliseconds` of device time have passed since the first of them:
// batches timed with events, each sized from the last one's time per repetition. Returns the last
// batch's time per repetition, in milliseconds.
double warm_up_for(const Case& c, cudaStream_t stream, double milliseconds, int& rep_counter) {
  Events e;
  double elapsed = 0, per_rep = 0;
  int batch = 1;
  do {  // at least one batch, for the time per repetition
    FUSEKIT_CUDA_CHECK(cudaEventRecord(e.start_, stream));
    for (int r = 0; r < batch; ++r) c.run(stream, rep_counter++);
    FUSEKIT_CUDA_CHECK(cudaEventRecord(e.stop_, stream));
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(e.stop_));
    float ms = 0;
    FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start_, e.stop_));
    elapsed += ms;
    per_rep = std::max(static_cast<double>(ms) / batch, 1e-3);
    batch = static_cast<int>(std::min(std::ceil((milliseconds - elapsed) / per_rep), 100000.0));
    batch = std::max(batch, 1);
  } while (elapsed < milliseconds);
  return per_rep;
}

// The case's operands, then `warmup` repetitions, finished.
void set_up(const Case& c, cudaStream_t stream, int warmup, int& rep_counter) {
  if (c.setup) c.setup(stream);
  for (int r = 0; r < warmup; ++r) c.run(stream, rep_counter++);
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

int sample_batch(double sample_us, double per_rep_ms) {
  if (!(sample_us > 0) || !(per_rep_ms > 0)) return 1;
  return static_cast<int>(
      std::clamp(std::ceil(sample_us * 1e-3 / per_rep_ms), 1.0, static_cast<double>(kMaxSampleBatch)));
}

uint64_t run_cases(store::Store& store, int64_t run, const std::vector<Case>& cases, const RunnerOptions& options) {
  // Each progress line says when its case began, in seconds since the first: where a long run's
  // time goes (set-up, warm-up and timing of each case).
  const auto began = std::chrono::steady_clock::now();
  const auto seconds = [&began] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  };
  profiler::CuptiTracer& tracer = profiler::CuptiTracer::instance();
  cudaStream_t stream = nullptr;
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  OnExit destroy_stream([stream] { cudaStreamDestroy(stream); });
  uint64_t dropped = 0;
  int rep_counter = 0;
  // Every case is timed before any is traced: once CUPTI has traced in a process, launches stay
  // dearer after its activity kinds are disabled again, which slows variants bound by launching
  // (H100: the libtorch embedding baseline at 8192x768 took 104-107 us timed before any tracing and
  // 179-187 us timed after the fused case's traced repetitions; the fused kernels 13.4-13.6 us both).
  for (size_t i = 0; i < cases.size(); ++i) {
    throw_if_interrupted();  // what the cases before recorded stays
    const Case& c = cases[i];
    std::fprintf(stderr, "[%zu/%zu] %.1f s: %s [%s]\n", i + 1, cases.size(), seconds(), c.info.name.c_str(),
                 c.info.variant.c_str());
    OnExit release([&c] {
      if (c.release) c.release();
    });
    set_up(c, stream, options.warmup, rep_counter);
    const double per_rep_ms = warm_up_for(c, stream, options.warmup_ms, rep_counter);
    const int batch = sample_batch(options.sample_us, per_rep_ms);

    // The GPU's clocks, temperature, power and throttling right before and after the timed
    // repetitions (after the warm-up: the conditions the samples were taken under), stored with the
    // case for the gate (profiler/gpu_conditions.h).
    int device = 0;
    FUSEKIT_CUDA_CHECK(cudaGetDevice(&device));
    const profiler::GpuConditions before = profiler::read_gpu_conditions(device);
    std::vector<Events> events(static_cast<size_t>(options.repetitions));
    for (int r = 0; r < options.repetitions; ++r) {
      FUSEKIT_CUDA_CHECK(cudaEventRecord(events[r].start_, stream));
      for (int b = 0; b < batch; ++b) c.run(stream, rep_counter++);
      FUSEKIT_CUDA_CHECK(cudaEventRecord(events[r].stop_, stream));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    std::vector<double> samples;
    for (Events& e : events) {
      float ms = 0;
      FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start_, e.stop_));
      samples.push_back(static_cast<double>(ms) * 1e6 / batch);
    }
    const profiler::GpuConditions after = profiler::read_gpu_conditions(device);
    std::vector<store::CaseMetric> metrics = c.metrics ? c.metrics() : std::vector<store::CaseMetric>{};
    for (const auto& [conditions, point] : {std::pair{&before, "start"}, {&after, "end"}}) {
      for (const profiler::NamedValue& v : profiler::condition_values(*conditions, point)) {
        metrics.push_back({v.name, v.value});
      }
    }
    store.add_case(run, c.info, samples, metrics);
  }
  if (options.traced_repetitions <= 0) return dropped;

  // Then the traced repetitions, for the kernel shares: each case set up again and warmed up by
  // options.warmup repetitions.
  for (size_t i = 0; i < cases.size(); ++i) {
    throw_if_interrupted();
    const Case& c = cases[i];
    std::fprintf(stderr, "[%zu/%zu] %.1f s: traced: %s [%s]\n", i + 1, cases.size(), seconds(), c.info.name.c_str(),
                 c.info.variant.c_str());
    OnExit release([&c] {
      if (c.release) c.release();
    });
    set_up(c, stream, options.warmup, rep_counter);
    tracer.start();
    OnExit stop_tracer([&tracer] {
      try {
        tracer.stop();
      } catch (const std::exception&) {  // already unwinding from the first error
      }
    });
    {
      profiler::ScopedRange case_range(c.info.name + " [" + c.info.variant + "]");
      for (int r = 0; r < options.traced_repetitions; ++r) {
        profiler::ScopedRange rep_range("rep");
        c.run(stream, rep_counter++);
      }
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    tracer.stop();  // before the flush; stop() is idempotent
    profiler::Trace trace = tracer.flush(false);
    dropped += trace.dropped_records;
    store.append_trace(run, trace);
  }
  return dropped;
}

double measure_copy_ceiling(size_t bytes, int repetitions) {
  void* a = nullptr;
  void* b = nullptr;
  FUSEKIT_CUDA_CHECK(cudaMalloc(&a, bytes));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&b, bytes));
  FUSEKIT_CUDA_CHECK(cudaMemset(a, 1, bytes));
  Events e;
  std::vector<double> seconds;
  for (int r = 0; r < repetitions + 3; ++r) {
    FUSEKIT_CUDA_CHECK(cudaEventRecord(e.start_));
    FUSEKIT_CUDA_CHECK(cudaMemcpy(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    FUSEKIT_CUDA_CHECK(cudaEventRecord(e.stop_));
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(e.stop_));
    float ms = 0;
    FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start_, e.stop_));
    if (r >= 3) seconds.push_back(static_cast<double>(ms) * 1e-3);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / profiler::median(seconds);
}

}  // namespace fusekit::suites
