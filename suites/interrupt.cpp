// SIGINT and SIGTERM during a recorded run (see interrupt.h).
#include "suites/interrupt.h"

#include <errno.h>
#include <signal.h>
#include <time.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace fusekit::suites {
namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_child = 0;     // a pid_t fits: Linux pids are below 2^22
volatile sig_atomic_t g_first_ms = 0;  // when the first signal came (CLOCK_MONOTONIC, ms, wraps harmlessly)

uint32_t now_ms() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<uint32_t>(t.tv_sec * 1000 + t.tv_nsec / 1000000);
}

// The first signal: remembered and passed on to the child. Repeats within a second are the same
// signal delivered twice (timeout signals its child, then the whole process group; a terminal's
// Ctrl-C reaches the group too) and are ignored. A repeat after that is a second request: it
// terminates as an uncaught signal would.
extern "C" void on_interrupt(int signal) {
  const int saved_errno = errno;
  if (g_signal == 0) {
    g_first_ms = static_cast<sig_atomic_t>(now_ms());  // modular (C++20); before g_signal says it is set
    g_signal = signal;
    const pid_t child = static_cast<pid_t>(g_child);
    if (child > 0) kill(child, signal);
  } else if (now_ms() - static_cast<uint32_t>(g_first_ms) > 1000u) {
    const pid_t child = static_cast<pid_t>(g_child);
    if (child > 0) kill(child, SIGKILL);
    struct sigaction fallback;
    std::memset(&fallback, 0, sizeof fallback);
    fallback.sa_handler = SIG_DFL;
    sigaction(signal, &fallback, nullptr);
    raise(signal);
  }
  errno = saved_errno;
}

struct sigaction g_previous[2];
int g_depth = 0;
constexpr int kSignals[2] = {SIGINT, SIGTERM};

}  // namespace

InterruptScope::InterruptScope() {
  if (g_depth++ > 0) return;  // nested scopes share the outer one's handlers
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  for (int sig : kSignals) sigaddset(&action.sa_mask, sig);  // one handler at a time
  action.sa_flags = SA_RESTART;                              // writes to pipes are not cut short
  for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &action, &g_previous[i]);
}

InterruptScope::~InterruptScope() {
  if (--g_depth > 0) return;
  for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
}

int interrupt_signal() { return g_signal; }

void set_interrupt_child(pid_t child) {
  g_child = child;
  const int signal = g_signal;
  if (child > 0 && signal != 0) kill(child, signal);  // caught before the child was registered
}

Interrupted::Interrupted(int signal)
    : std::runtime_error(std::string("interrupted by ") + (signal == SIGINT    ? "SIGINT"
                                                           : signal == SIGTERM ? "SIGTERM"
                                                                               : "a signal")),
      signal_(signal) {}

void throw_if_interrupted() {
  const int signal = g_signal;
  if (signal != 0) throw Interrupted(signal);
}

void reset_interrupt_for_testing() {
  g_signal = 0;
  g_child = 0;
  g_first_ms = 0;
}

}  // namespace fusekit::suites
