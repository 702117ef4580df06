// Another program run into a run of a store: `fusekit trace -- cmd` and the peers scripts.
//
// The program gets FUSEKIT_TRACE_DB and FUSEKIT_TRACE_RUN naming the run and, when traced, the
// injection library (CUDA_INJECTION64_PATH) that the CUDA driver loads into it at cuInit, as it does
// for Nsight Systems; its records then go into that run. The library is found next to the fusekit
// binary, or where FUSEKIT_INJECT_LIBRARY says.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusekit::suites {

// Thrown when the command's program cannot be started (not found, not executable): what() is the
// one line to print, "cannot run '<program>': <reason>"; a shell would exit with 127.
class CommandNotStarted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `command` with FUSEKIT_TRACE_DB and FUSEKIT_TRACE_RUN naming `run` of the store at `db`, and,
// if `traced`, with the injection library flushing every `flush_ms`. Returns its exit code (128 +
// signal if killed); throws CommandNotStarted if it could not be started, and std::runtime_error if
// tracing was asked for and the injection library or CUPTI is missing. Under an InterruptScope
// (suites/interrupt.h) a SIGINT or SIGTERM is passed on to the command.
int run_recorded_command(const std::string& db, int64_t run, const std::vector<std::string>& command, int flush_ms,
                         bool traced);

}  // namespace fusekit::suites
