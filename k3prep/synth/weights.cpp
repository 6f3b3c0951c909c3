#include "k3prep/synth/weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "formats/mxfp4.h"

namespace k3::synth {
namespace {

// Irwin–Hall(4) of 16-bit uniforms: mean 4·65535/2, variance 4·(65536² − 1)/12.
constexpr int32_t kIrwinHallMean = 2 * 65535;
// 1/sqrt((65536² − 1)/3), computed once with exactly rounded double ops.
const float kInvIrwinHallSd =
    static_cast<float>(1.0 / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0));

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Largest-remainder rounding of counts to integers summing to `quanta` (ties: lower index).
std::vector<uint64_t> Quantise(const std::vector<uint64_t>& counts, uint64_t quanta) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  std::vector<uint64_t> q(counts.size());
  std::vector<std::pair<uint64_t, size_t>> rem;  // (remainder, index)
  uint64_t assigned = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const unsigned __int128 scaled = static_cast<unsigned __int128>(counts[i]) * quanta;
    q[i] = static_cast<uint64_t>(scaled / total);
    rem.emplace_back(static_cast<uint64_t>(scaled % total), i);
    assigned += q[i];
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; assigned < quanta; ++k, ++assigned) q[rem[k].second] += 1;
  return q;
}

// Fills `table` (65,536 entries) with value v repeated q[v] times, in value order.
void FillTable(const std::vector<uint64_t>& q, uint8_t* table) {
  size_t at = 0;
  for (size_t v = 0; v < q.size(); ++v) {
    for (uint64_t k = 0; k < q[v]; ++k) table[at++] = static_cast<uint8_t>(v);
  }
}

}  // namespace

uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t TensorKey(uint64_t seed, std::string_view name) {
  return SplitMix64(seed ^ Fnv1a64(name));
}

float NormalFromBits(uint64_t r) {
  const int32_t s = static_cast<int32_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) +
                                         ((r >> 32) & 0xFFFF) + (r >> 48));
  return static_cast<float>(s - kIrwinHallMean) * kInvIrwinHallSd;
}

uint16_t Bf16FromF32(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

std::vector<Job> ShardJobs(const Layout& layout, size_t shard, uint64_t max_job_bytes) {
  const ShardPlan& sp = layout.shards[shard];
  std::vector<Job> jobs;
  size_t i = sp.first_tensor;
  const size_t end = sp.first_tensor + sp.tensor_count;
  while (i < end) {
    const TensorPlan& t = layout.tensors[i];
    if (t.part == ExpertPart::kW1Packed) {
      Job j;
      j.tensor = i;
      j.expert = true;
      for (size_t k = i; k < i + 6; ++k) j.nbytes += layout.tensors[k].nbytes;
      jobs.push_back(j);
      i += 6;
      continue;
    }
    const uint64_t esize = DTypeSize(t.dtype);
    const uint64_t numel = t.nbytes / esize;
    const uint64_t per_job = std::max<uint64_t>(1, max_job_bytes / esize);
    for (uint64_t first = 0; first < numel; first += per_job) {
      Job j;
      j.tensor = i;
      j.first = first;
      j.count = std::min(per_job, numel - first);
      j.nbytes = j.count * esize;
      jobs.push_back(j);
    }
    ++i;
  }
  return jobs;
}

struct WeightGenerator::Tables {
  uint8_t scale[65536];
  uint8_t pair[65536];  // packed byte: low nibble even element, high nibble odd
};

WeightGenerator::WeightGenerator(const Layout& layout, uint64_t seed)
    : layout_(layout), seed_(seed), shortcut_(layout.expert_bytes > kShortcutExpertBytes) {
  if (!shortcut_) return;
  // Build the tables for every distinct matrix std up front, so Fill never mutates.
  for (const TensorPlan& t : layout.tensors) {
    if (t.part == ExpertPart::kNone) continue;
    const float sd = t.init.a;
    if (std::any_of(tables_.begin(), tables_.end(), [&](const auto& e) { return e.first == sd; })) {
      continue;
    }
    auto tab = std::make_unique<Tables>();
    // Fixed key: the tables depend on the std only, never on --seed.
    const uint64_t key = TensorKey(0x6B33'5359'4E54'4842ull ^ std::bit_cast<uint32_t>(sd),
                                   "k3 synth mxfp4 code distribution");
    constexpr uint64_t kGroups = 16384;
    std::vector<uint64_t> scale_counts(256, 0), code_counts(16, 0);
    float x[mxfp4::kGroupSize];
    uint8_t packed[mxfp4::kBytesPerGroup];
    uint8_t scale = 0;
    for (uint64_t g = 0; g < kGroups; ++g) {
      for (int i = 0; i < mxfp4::kGroupSize; ++i) {
        x[i] = NormalFromBits(Draw(key, g * mxfp4::kGroupSize + static_cast<uint64_t>(i))) * sd;
      }
      mxfp4::EncodeGroup(x, packed, &scale);
      scale_counts[scale] += 1;
      for (uint8_t byte : packed) {
        code_counts[byte & 0xF] += 1;
        code_counts[byte >> 4] += 1;
      }
    }
    FillTable(Quantise(scale_counts, 65536), tab->scale);
    const std::vector<uint64_t> q = Quantise(code_counts, 65536);
    std::vector<uint64_t> pair_weights(256);
    for (size_t lo = 0; lo < 16; ++lo) {
      for (size_t hi = 0; hi < 16; ++hi) pair_weights[lo | (hi << 4)] = q[lo] * q[hi];
    }
    FillTable(Quantise(pair_weights, 65536), tab->pair);
    tables_.emplace_back(sd, std::move(tab));
  }
}

WeightGenerator::~WeightGenerator() = default;

const WeightGenerator::Tables& WeightGenerator::TablesFor(float sd) const {
  for (const auto& [s, t] : tables_) {
    if (s == sd) return *t;
  }
  return *tables_.front().second;  // unreachable: every expert std has a table
}

void WeightGenerator::Fill(const Job& job, uint8_t* dst) const {
  if (job.expert) {
    FillExpert(job.tensor, dst);
  } else {
    FillElements(layout_.tensors[job.tensor], job.first, job.count, dst);
  }
}

void WeightGenerator::FillElements(const TensorPlan& t, uint64_t first, uint64_t count,
                                   uint8_t* dst) const {
  const uint64_t key = TensorKey(seed_, t.name);
  const bool f32 = t.dtype == DType::kF32;
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t i = first + k;
    float v = 0.0f;
    switch (t.init.kind) {
      case InitKind::kNormal:
        v = NormalFromBits(Draw(key, i)) * t.init.a;
        break;
      case InitKind::kGain:
        v = 1.0f + NormalFromBits(Draw(key, i)) * t.init.a;
        break;
      case InitKind::kLinspace: {
        const int64_t n = t.init.count;
        const int64_t ii = static_cast<int64_t>(i);
        if (ii >= n) {
          v = 0.0f;
        } else if (n == 1) {
          v = t.init.a;
        } else {
          const double a = t.init.a, b = t.init.b;
          v = static_cast<float>(a + (b - a) * static_cast<double>(ii) /
                                         static_cast<double>(n - 1));
        }
        break;
      }
      case InitKind::kMxfp4:
        break;  // experts go through FillExpert
    }
    if (f32) {
      std::memcpy(dst + 4 * k, &v, 4);
    } else {
      const uint16_t h = Bf16FromF32(v);
      std::memcpy(dst + 2 * k, &h, 2);
    }
  }
}

void WeightGenerator::FillExpert(size_t w1_packed, uint8_t* dst) const {
  thread_local std::vector<float> row;
  for (size_t m = 0; m < 3; ++m) {
    const TensorPlan& pk = layout_.tensors[w1_packed + 2 * m];
    const TensorPlan& sc = layout_.tensors[w1_packed + 2 * m + 1];
    const uint64_t rows = pk.shape[0], cols = pk.shape[1] * 2;
    const uint64_t groups = cols / mxfp4::kGroupSize;
    uint8_t* packed = dst;
    uint8_t* scales = dst + pk.nbytes;
    const uint64_t key = TensorKey(seed_, pk.name);
    const float sd = pk.init.a;
    if (!shortcut_) {
      row.resize(cols);
      for (uint64_t r = 0; r < rows; ++r) {
        for (uint64_t c = 0; c < cols; ++c) row[c] = NormalFromBits(Draw(key, r * cols + c)) * sd;
        mxfp4::EncodeRow(row.data(), cols, packed + r * cols / 2, scales + r * groups);
      }
    } else {
      const Tables& tab = TablesFor(sd);
      for (uint64_t g = 0; g < rows * groups; ++g) {
        scales[g] = tab.scale[Draw(key, g * 5) & 0xFFFF];
        uint8_t* out = packed + g * mxfp4::kBytesPerGroup;
        for (uint64_t j = 0; j < 4; ++j) {
          const uint64_t r = Draw(key, g * 5 + 1 + j);
          out[4 * j + 0] = tab.pair[r & 0xFFFF];
          out[4 * j + 1] = tab.pair[(r >> 16) & 0xFFFF];
          out[4 * j + 2] = tab.pair[(r >> 32) & 0xFFFF];
          out[4 * j + 3] = tab.pair[r >> 48];
        }
      }
    }
    dst += pk.nbytes + sc.nbytes;
  }
}

}  // namespace k3::synth
