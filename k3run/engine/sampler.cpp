#include "k3run/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "k3run/engine/generate.h"

namespace k3::run {

Status ValidateSamplerOptions(const SamplerOptions& o) {
  if (o.temperature && !(std::isfinite(*o.temperature) && *o.temperature > 0)) {
    return Status::Invalid("--temperature " + std::to_string(*o.temperature) +
                           ": must be a finite number > 0 (omit the sampling flags for greedy)");
  }
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1)) {
    return Status::Invalid("--top-p " + std::to_string(*o.top_p) +
                           ": must be in (0, 1] (1 keeps every token)");
  }
  if (o.top_k && *o.top_k < 0) {
    return Status::Invalid("--top-k " + std::to_string(*o.top_k) +
                           ": must be >= 0 (0 keeps every token)");
  }
  return Status::Ok();
}

uint64_t SplitMix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Pcg32::Pcg32(uint64_t seed, uint64_t turn) {
  uint64_t x = seed ^ (turn * 0x9e3779b97f4a7c15ULL);
  const uint64_t initstate = SplitMix64(&x);
  const uint64_t initseq = SplitMix64(&x);
  // pcg32_srandom_r from the reference implementation.
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  Next();
  state_ += initstate;
  Next();
}

uint32_t Pcg32::Next() {
  const uint64_t old = state_;
  state_ = old * 6364136223846793005ULL + inc_;
  const auto xorshifted = static_cast<uint32_t>(((old >> 18) ^ old) >> 27);
  const auto rot = static_cast<uint32_t>(old >> 59);
  return (xorshifted >> rot) | (xorshifted << ((32 - rot) & 31));
}

double Pcg32::Uniform() {
  const uint64_t hi = Next();
  const uint64_t lo = Next();
  const uint64_t bits = ((hi << 32) | lo) >> 11;  // 53 bits
  return static_cast<double>(bits) * 0x1.0p-53;
}

Sampler::Sampler(const SamplerOptions& o, uint64_t seed, uint64_t turn)
    : greedy_(!o.sampling()),
      temperature_(o.temperature.value_or(1.0)),
      top_p_(o.top_p.value_or(1.0)),
      top_k_(o.top_k.value_or(0)),
      rng_(seed, turn) {}

int32_t Sampler::Next(const float* logits, int64_t n) {
  if (greedy_ || n <= 1) return Greedy(logits, n);
  const auto N = static_cast<size_t>(n);
  double max = -INFINITY;
  for (size_t i = 0; i < N; ++i) max = std::max(max, static_cast<double>(logits[i]));
  p_.resize(N);
  double sum = 0;
  for (size_t i = 0; i < N; ++i) {
    p_[i] = std::exp((static_cast<double>(logits[i]) - max) / temperature_);
    sum += p_[i];
  }
  // NaN or ±inf logits make the distribution meaningless; argmax is the defined fallback.
  if (!std::isfinite(sum) || sum <= 0) return Greedy(logits, n);
  order_.resize(N);
  for (size_t i = 0; i < N; ++i) order_[i] = static_cast<int32_t>(i);
  size_t keep = N;
  if (top_k_ > 0 && static_cast<uint64_t>(top_k_) < N) keep = static_cast<size_t>(top_k_);
  const auto by_p = [this](int32_t a, int32_t b) {
    const double pa = p_[static_cast<size_t>(a)], pb = p_[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  // Only the kept prefix needs ordering; the rest never influences the draw.
  if (keep < N) {
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(keep),
                      order_.end(), by_p);
  } else {
    std::sort(order_.begin(), order_.end(), by_p);
  }
  double kept = 0;
  size_t k = 0;
  const double target = top_p_ * sum;
  while (k < keep) {
    kept += p_[static_cast<size_t>(order_[k])];
    ++k;
    if (top_p_ < 1.0 && kept >= target) break;
  }
  const double r = rng_.Uniform() * kept;
  double run = 0;
  for (size_t i = 0; i < k; ++i) {
    run += p_[static_cast<size_t>(order_[i])];
    if (r < run) return order_[i];
  }
  return order_[k - 1];  // r rounded up to the kept mass
}

}  // namespace k3::run
