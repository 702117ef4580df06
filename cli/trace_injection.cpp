// The injection library: `fusekit trace -- cmd` sets CUDA_INJECTION64_PATH to this library, and the
// CUDA driver calls InitializeInjection() in the traced process at cuInit, as it does for Nsight
// Systems. From then on CUPTI records the process's activity; a background thread flushes it into
// the store every FUSEKIT_TRACE_FLUSH_MS (default 1000) in one transaction each, and the last
// flush runs at exit, whatever the exit code. A process killed by a signal keeps every earlier flush.
//
// Environment: FUSEKIT_TRACE_DB (the store), FUSEKIT_TRACE_RUN (the run id `fusekit trace` created),
// FUSEKIT_TRACE_FLUSH_MS, FUSEKIT_TRACE_VERBOSE.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <unistd.h>

#include "profiler/cupti_tracer.h"
#include "store/store.h"

namespace {

struct Injection {
  std::optional<fusekit::store::Store> store;
  int64_t run = 0;
  std::chrono::milliseconds interval{1000};
  std::thread flusher;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::mutex write_mutex;              // the flusher and the exit handler both write
  pid_t pid = 0;                       // a forked child inherits the exit handler but not the flusher thread
  fusekit::profiler::Trace unwritten;  // records whose append failed: tried again at the next flush
  size_t kernels = 0;
  size_t ranges = 0;
  bool verbose = false;  // FUSEKIT_TRACE_VERBOSE=1: one line per traced process at exit
};

Injection& injection() {
  static Injection* i = new Injection;  // never destroyed: used from the exit handler
  return *i;
}

void write(Injection& in, bool final) {
  std::lock_guard<std::mutex> lock(in.write_mutex);
  try {
    fusekit::profiler::CuptiTracer& tracer = fusekit::profiler::CuptiTracer::instance();
    fusekit::profiler::Trace trace = final ? tracer.flush(true) : tracer.collect_completed();
    in.kernels += trace.kernels.size();
    in.ranges += trace.ranges.size();
    in.unwritten.process_id = trace.process_id;
    in.unwritten.append(std::move(trace));
    if (!in.unwritten.empty()) {
      in.store->append_trace(in.run, in.unwritten);
      in.unwritten = fusekit::profiler::Trace{};
    }
    if (final && in.verbose) {
      std::fprintf(stderr, "fusekit trace: process %d wrote %zu kernels and %zu NVTX ranges (NVTX through %s)\n",
                   static_cast<int>(getpid()), in.kernels, in.ranges, std::getenv("NVTX_INJECTION64_PATH"));
    }
  } catch (const std::exception& e) {
    const size_t held = in.unwritten.kernels.size() + in.unwritten.memcpys.size() + in.unwritten.memsets.size() +
                        in.unwritten.api_calls.size() + in.unwritten.ranges.size();
    if (final) {
      std::fprintf(stderr, "fusekit trace: %zu records could not be written and are lost: %s\n", held, e.what());
    } else {
      std::fprintf(stderr, "fusekit trace: %s (%zu records held for the next flush)\n", e.what(), held);
    }
  }
}

void flush_loop() {
  Injection& in = injection();
  std::unique_lock<std::mutex> lock(in.mutex);
  while (!in.stopping) {
    if (in.wake.wait_for(lock, in.interval, [&] { return in.stopping; })) break;
    lock.unlock();
    write(in, false);
    lock.lock();
  }
}

void at_exit() {
  Injection& in = injection();
  if (getpid() != in.pid) return;
  {
    std::lock_guard<std::mutex> lock(in.mutex);
    in.stopping = true;
  }
  in.wake.notify_all();
  if (in.flusher.joinable()) in.flusher.join();
  write(in, true);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  static bool initialized = false;
  if (initialized) return 1;
  initialized = true;
  Injection& in = injection();
  const char* db = std::getenv("FUSEKIT_TRACE_DB");
  const char* run = std::getenv("FUSEKIT_TRACE_RUN");
  if (!db || !run) {
    std::fprintf(stderr, "fusekit trace: FUSEKIT_TRACE_DB and FUSEKIT_TRACE_RUN must be set; not tracing\n");
    return 1;
  }
  try {
    in.store = fusekit::store::Store::open(db, fusekit::store::Store::Mode::read_write);
    in.run = std::stoll(run);
    (void)in.store->run(in.run);
    const char* verbose = std::getenv("FUSEKIT_TRACE_VERBOSE");
    in.verbose = verbose && *verbose && *verbose != '0';
    if (const char* ms = std::getenv("FUSEKIT_TRACE_FLUSH_MS")) in.interval = std::chrono::milliseconds(std::stoll(ms));
    // The traced program may have loaded a CUPTI of its own before us (PyTorch does), and ours then
    // binds to it: point NVTX at that copy, not the one `fusekit trace` named.
    const std::string cupti = fusekit::profiler::cupti_library_path();
    if (!cupti.empty()) setenv("NVTX_INJECTION64_PATH", cupti.c_str(), 1);
    fusekit::profiler::CuptiTracer::instance().start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusekit trace: not tracing: %s\n", e.what());
    in.store.reset();
    return 1;
  }
  in.pid = getpid();
  std::atexit(at_exit);
  in.flusher = std::thread(flush_loop);
  return 1;
}
