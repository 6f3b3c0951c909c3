#include "k3run/mpi/fault_report.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>

namespace k3::run::mpi {
namespace {

constexpr size_t kMaxNamed = 64;  // ranks named in the message (the rest as "…")

std::atomic<int> g_layer{-1};
std::atomic<int> g_count{0};
std::atomic<int> g_ranks[kMaxNamed];
std::atomic<int> g_size{1};

// Async-signal-safe text building into a fixed buffer.
struct Text {
  char buf[1024];
  size_t n = 0;
  void Add(const char* s) {
    while (*s != '\0' && n < sizeof buf) buf[n++] = *s++;
  }
  void Int(int v) {
    char tmp[16];
    size_t k = 0;
    unsigned u = v < 0 ? 0u : static_cast<unsigned>(v);
    do {
      tmp[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0 && k < sizeof tmp);
    while (k > 0 && n < sizeof buf) buf[n++] = tmp[--k];
  }
};

void OnTerm(int) {
  Text t;
  t.Add("\nerror: k3run rank 0 of ");
  t.Int(g_size.load());
  t.Add(": mpirun ended the run (SIGTERM) ");
  const int layer = g_layer.load(), count = g_count.load();
  if (count > 0) {
    t.Add("while rank 0 waited for the experts of layer ");
    t.Int(layer);
    t.Add(" from rank");
    t.Add(count > 1 ? "s" : "");
    for (int i = 0; i < count && i < static_cast<int>(kMaxNamed); ++i) {
      t.Add(" ");
      t.Int(g_ranks[i].load());
    }
    if (count > static_cast<int>(kMaxNamed)) t.Add(" ...");
  } else if (layer >= 0) {
    t.Add("while rank 0 computed layer ");
    t.Int(layer);
    t.Add(" (no rank owed it experts)");
  } else {
    t.Add("before the first MoE layer");
  }
  t.Add(". A rank exited, was killed or failed (mpirun names it); the run is invalid (exit 4)\n");
  ssize_t ignored = ::write(2, t.buf, t.n);
  (void)ignored;
  ::_exit(4);
}

}  // namespace

void FaultReport::Install(int size) {
  g_size.store(size);
  struct sigaction sa {};
  sa.sa_handler = OnTerm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

void FaultReport::Waiting(int layer, std::span<const int> ranks) {
  g_count.store(0);
  for (size_t i = 0; i < ranks.size() && i < kMaxNamed; ++i) g_ranks[i].store(ranks[i]);
  g_layer.store(layer);
  g_count.store(static_cast<int>(ranks.size()));
}

}  // namespace k3::run::mpi
