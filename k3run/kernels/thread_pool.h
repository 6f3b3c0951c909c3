// The compute threads behind MatMul (and any other fork/join of the engine).
//
// Why not OpenMP: libgomp's idle workers spin (OMP_WAIT_POLICY is read once, at library load)
// and its static split makes every parallel region wait for its slowest thread. On a 2-core
// machine that also runs the engine's reader threads — or anything else — a descheduled worker
// stalls each of the ~4,000 MatMuls of a token for a time slice: measured on the bench preset at
// 0.2 + 0.2 GB under a parallel build, 17.4 s/token with libgomp's default policy, 2.0 with
// OMP_WAIT_POLICY=passive. Here work is cut into chunks that threads CLAIM: the calling thread
// starts at once and takes every chunk no worker has claimed, so a late worker costs nothing;
// idle workers spin briefly and then sleep on a futex (std::atomic::wait).
//
// Why not the pread pool in common/direct_reader.cpp, which also lets the caller claim tasks: it
// hands each job over under a mutex and a condition variable with a heap-allocated job, fine for
// reads of hundreds of microseconds, but a MatMul of a small expert takes a few microseconds and
// a token runs thousands of them.
//
// Determinism: fn(c) is called exactly once for each chunk c in [0, n); which thread runs it
// never matters to a caller whose chunks write disjoint outputs computed independently of the
// thread (MatMul: each output row is computed the same way by whichever thread owns it).
// Thread safety: ParallelChunks is not reentrant; one thread (the model thread) calls it.
#pragma once

#include <cstdint>
#include <functional>

namespace k3::kernels {

// Calls fn(c) for every c in [0, n) using up to `threads` threads (the caller is one of them)
// and returns when all are done. threads ≤ 1 or n ≤ 1 runs inline, in order.
void ParallelChunks(int threads, int64_t n, const std::function<void(int64_t chunk)>& fn);

}  // namespace k3::kernels
