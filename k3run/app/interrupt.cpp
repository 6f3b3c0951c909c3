#include "k3run/app/interrupt.h"

#include <signal.h>

#include <atomic>

namespace k3::run {
namespace {

std::atomic<int> g_interrupts{0};
static_assert(std::atomic<int>::is_always_lock_free, "read and written in a signal handler");

void OnInterrupt(int sig) {
  if (g_interrupts.fetch_add(1) >= 1) {
    // A second Ctrl-C: the user wants out now.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

}  // namespace

void InstallInterruptHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: the chat prompt's read returns EINTR
  ::sigaction(SIGINT, &sa, nullptr);
}

bool Interrupted() { return g_interrupts.load() > 0; }

void ClearInterrupt() { g_interrupts.store(0); }

}  // namespace k3::run
