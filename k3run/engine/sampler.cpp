#include "k3run/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "k3run/engine/generate.h"

namespace k3::run {

namespace {

std::string Num(double v) {
  std::string s = std::to_string(v);
  // "0.500000" → "0.5": the value as typed, for messages.
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  return s;
}

// The lowest id among the largest values: Greedy() over doubles.
int32_t ArgMax(const std::vector<double>& l) {
  size_t best = 0;
  for (size_t i = 1; i < l.size(); ++i) {
    if (l[i] > l[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace

Status ValidateSamplerOptions(const SamplerOptions& o) {
  if (o.temperature && !(std::isfinite(*o.temperature) && *o.temperature >= 0)) {
    return Status::Invalid("--temperature " + Num(*o.temperature) +
                           ": must be a finite number >= 0 (0: greedy)");
  }
  if (o.top_p && !(*o.top_p > 0 && *o.top_p <= 1)) {
    return Status::Invalid("--top-p " + Num(*o.top_p) + ": must be in (0, 1] (1 keeps every token)");
  }
  if (o.top_k && *o.top_k < 0) {
    return Status::Invalid("--top-k " + std::to_string(*o.top_k) +
                           ": must be >= 0 (0 keeps every token)");
  }
  if (o.min_p && !(*o.min_p >= 0 && *o.min_p <= 1)) {
    return Status::Invalid("--min-p " + Num(*o.min_p) + ": must be in [0, 1] (0 keeps every token)");
  }
  if (!(std::isfinite(o.repeat_penalty) && o.repeat_penalty > 0)) {
    return Status::Invalid("--repeat-penalty " + Num(o.repeat_penalty) +
                           ": must be a finite number > 0 (1: off)");
  }
  if (o.repeat_last_n < 0) {
    return Status::Invalid("--repeat-last-n " + std::to_string(o.repeat_last_n) +
                           ": must be >= 0 (0: no penalty)");
  }
  if (!std::isfinite(o.presence_penalty)) {
    return Status::Invalid("--presence-penalty must be a finite number (0: off)");
  }
  if (!std::isfinite(o.frequency_penalty)) {
    return Status::Invalid("--frequency-penalty must be a finite number (0: off)");
  }
  return Status::Ok();
}

std::vector<std::string> SamplerWarnings(const SamplerOptions& o) {
  std::vector<std::string> w;
  const bool greedy_asked = o.temperature && *o.temperature == 0;
  if (greedy_asked) {
    const char* why = " has no effect: --temperature 0 decodes greedily";
    if (o.seed) w.push_back(std::string("--seed") + why);
    if (o.top_k) w.push_back(std::string("--top-k") + why);
    if (o.top_p) w.push_back(std::string("--top-p") + why);
    if (o.min_p) w.push_back(std::string("--min-p") + why);
  } else if (!o.temperature && o.sampling()) {
    std::string given = o.top_k ? "--top-k" : o.top_p ? "--top-p" : o.min_p ? "--min-p" : "--seed";
    w.push_back(given + " without --temperature: sampling at temperature 1 (give --temperature "
                        "T to choose, or --temperature 0 for greedy)");
  }
  const bool penalty = o.repeat_penalty != 1.0 || o.presence_penalty != 0.0 ||
                       o.frequency_penalty != 0.0;
  if (penalty && o.repeat_last_n == 0) {
    w.push_back("the penalties have no effect: --repeat-last-n 0 looks at no token");
  } else if (!penalty && o.repeat_last_n_set) {
    w.push_back("--repeat-last-n has no effect without --repeat-penalty, --presence-penalty or "
                "--frequency-penalty");
  }
  return w;
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
    : o_(o), greedy_(!o.sampling() && !o.penalised()), rng_(seed, turn) {}

void Sampler::Penalise(const float* logits, size_t n, std::span<const int32_t> recent) {
  l_.assign(logits, logits + n);
  if (!o_.penalised()) return;
  const size_t window = std::min(recent.size(), static_cast<size_t>(o_.repeat_last_n));
  std::unordered_map<int32_t, int64_t> count;
  for (int32_t id : recent.subspan(recent.size() - window)) {
    if (id >= 0 && static_cast<size_t>(id) < n) ++count[id];
  }
  for (const auto& [id, c] : count) {
    double& l = l_[static_cast<size_t>(id)];
    l = l > 0 ? l / o_.repeat_penalty : l * o_.repeat_penalty;
    l -= static_cast<double>(c) * o_.frequency_penalty + o_.presence_penalty;
  }
}

size_t Sampler::Truncate(size_t n) {
  const double max = *std::max_element(l_.begin(), l_.end());
  p_.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p_[i] = std::exp(l_[i] - max);
  // NaN or ±inf logits make the distribution meaningless; argmax is the defined fallback.
  if (!std::isfinite(sum) || sum <= 0) return 0;
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
  size_t keep = n;
  const int64_t top_k = o_.top_k.value_or(0);
  if (top_k > 0 && static_cast<uint64_t>(top_k) < n) keep = static_cast<size_t>(top_k);
  const auto by_p = [this](int32_t a, int32_t b) {
    const double pa = p_[static_cast<size_t>(a)], pb = p_[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  // Only the kept prefix needs ordering; the rest never influences the draw.
  const auto mid = order_.begin() + static_cast<std::ptrdiff_t>(keep);
  if (keep < n) {
    std::partial_sort(order_.begin(), mid, order_.end(), by_p);
  } else {
    std::sort(order_.begin(), order_.end(), by_p);
  }
  const double top_p = o_.top_p.value_or(1.0);
  if (top_p < 1.0) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += p_[static_cast<size_t>(order_[i])];
    double run = 0;
    size_t k = 0;
    while (k < keep) {
      run += p_[static_cast<size_t>(order_[k++])];
      if (run >= top_p * mass) break;
    }
    keep = k;
  }
  const double floor = o_.min_p.value_or(0.0) * p_[static_cast<size_t>(order_[0])];
  size_t k = 1;
  while (k < keep && p_[static_cast<size_t>(order_[k])] >= floor) ++k;
  return k;
}

int32_t Sampler::Draw(size_t kept) {
  const double T = o_.effective_temperature();
  const double max = l_[static_cast<size_t>(order_[0])];
  double sum = 0;
  for (size_t i = 0; i < kept; ++i) {
    const auto id = static_cast<size_t>(order_[i]);
    sum += p_[id] = std::exp((l_[id] - max) / T);
  }
  const double r = rng_.Uniform() * sum;
  double run = 0;
  for (size_t i = 0; i < kept; ++i) {
    run += p_[static_cast<size_t>(order_[i])];
    if (r < run) return order_[i];
  }
  return order_[kept - 1];  // r rounded up to the kept mass
}

int32_t Sampler::Next(const float* logits, int64_t n, std::span<const int32_t> recent) {
  if (greedy_ || n <= 1) return Greedy(logits, n);
  const auto N = static_cast<size_t>(n);
  Penalise(logits, N, recent);
  if (!o_.sampling()) return ArgMax(l_);
  const size_t kept = Truncate(N);
  if (kept == 0) return ArgMax(l_);
  return Draw(kept);
}

}  // namespace k3::run
