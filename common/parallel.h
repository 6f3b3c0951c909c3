// ParallelFor: items 0..n-1 spread over up to `threads` workers that claim the next unclaimed
// item from one atomic counter, so a slow item never holds back the ones after it.
//
// The calling thread is worker 0; ParallelFor returns when every item has been run and every
// worker joined. There is no error channel: callers that need results write them into a slot of
// their own per item (or per worker) and combine them after the call, which keeps the outcome
// independent of the order in which items finish.
//
// Thread safety: `fn` runs concurrently on different items; it must synchronise whatever the
// items share. Exceptions must not escape `fn` (a throwing worker terminates the process).
#pragma once

#include <cstddef>
#include <functional>

namespace k3 {

// How many workers ParallelFor(n, threads, ...) uses: min(max(threads, 1), n).
size_t ParallelWorkers(size_t n, int threads);

// Calls fn(item, worker) once for every item in [0, n), on ParallelWorkers(n, threads) workers
// numbered 0..workers-1 (one worker runs one item at a time, so per-worker state indexed by
// `worker` needs no lock). Items are claimed in ascending order; their completion order is
// unspecified.
void ParallelFor(size_t n, int threads, const std::function<void(size_t item, size_t worker)>& fn);

}  // namespace k3
