// SIGINT and SIGTERM during a recorded run (`fusekit bench`, `fusekit trace`), as `timeout` or a
// CI job's cancel send them: the run stops between cases, the signal is passed on to the program it
// is running at the time (the peers script, the traced command), what the run recorded stays in the
// store, and the run ends with status "interrupted" and exit code 128 + the signal. Without this, a
// signal killed fusekit alone: the run stayed "running", the peers' samples were never read in and
// the child went on writing into the store.
//
// The first signal is caught; another (either of the two) within a second is ignored (timeout, and a
// terminal's Ctrl-C, deliver one twice: to fusekit and to its process group); one after that
// terminates at once, the child with SIGKILL, as a second Ctrl-C is meant to.
#pragma once

#include <sys/types.h>

#include <stdexcept>

namespace fusekit::suites {

// Catches SIGINT and SIGTERM while it lives; restores the previous handlers after.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The signal caught in this process (0: none yet).
int interrupt_signal();

// The child that a caught signal is passed on to (0: none). run_recorded_command sets it while it
// waits; a signal caught before the child was registered is passed on here.
void set_interrupt_child(pid_t child);

// Thrown between cases once a signal was caught.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal);
  int signal() const { return signal_; }
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
};

void throw_if_interrupted();

// For the tests: forgets a caught signal.
void reset_interrupt_for_testing();

}  // namespace fusekit::suites
