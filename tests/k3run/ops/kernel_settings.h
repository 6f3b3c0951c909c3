// Restores the process-wide kernel settings (ISA path, thread count) a test changes, when the
// test's scope ends: tests that loop over paths and threads leave the next test as they found it.
#pragma once

#include "k3run/kernels/matmul.h"
#include "k3run/kernels/thread_pool.h"

namespace k3::ops::testing {

class KernelSettings {
 public:
  KernelSettings() : isa_(kernels::ActiveIsa()), threads_(kernels::Threads()) {}
  ~KernelSettings() {
    kernels::SetIsa(isa_);
    kernels::SetThreads(threads_);
  }
  KernelSettings(const KernelSettings&) = delete;
  KernelSettings& operator=(const KernelSettings&) = delete;

 private:
  kernels::Isa isa_;
  int threads_;
};

}  // namespace k3::ops::testing
