// SIGINT and SIGTERM during a recorded run (see interrupt.h).
#include "suites/interrupt.h"

#include <signal.h>

#include <cstring>
#include <string>

namespace fusekit::suites {
namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_child = 0;  // a pid_t fits: Linux pids are below 2^22

extern "C" void on_interrupt(int signal) {
  g_signal = signal;
  const pid_t child = static_cast<pid_t>(g_child);
  if (child > 0) kill(child, signal);  // async-signal-safe
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
  action.sa_flags = SA_RESETHAND;  // a second signal terminates as usual
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
}

}  // namespace fusekit::suites
