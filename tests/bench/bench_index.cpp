// Benchmark (not a test): how close CheckpointIndex::Open comes to the raw speed of the JSON
// parser it is built on. It writes N shards shaped like the release (one MoE layer per shard:
// the layer's 25 trunk tensors, then 896 experts × 6 tensors = 5,401 entries with the released
// names) but with tiny shapes so the files stay small, then measures
//   (a) nlohmann::json::sax_parse with a do-nothing handler over the same header bytes, and
//   (b) CheckpointIndex::Open over the directory (file reads, validation, hash map),
// each as the best of R rounds (a and b alternate, so both see the same load from other
// processes), and prints (b)/(a) in header MB/s. The aim is ≥ 80 %.
//
// Usage: k3_bench_index [--dir DIR] [--shards N] [--repeat R]
//   --dir DIR   where to write the shards (default: a fresh directory under /tmp, removed after)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/sysinfo.h"
#include "formats/safetensors.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExperts = 896;

// The 25 non-expert tensors of a released MoE layer shard (model-00013-of-000096).
constexpr const char* kTrunk[] = {
    "block_sparse_moe.gate.e_score_correction_bias",
    "block_sparse_moe.gate.weight",
    "block_sparse_moe.routed_expert_down_proj.weight",
    "block_sparse_moe.routed_expert_norm.weight",
    "block_sparse_moe.routed_expert_up_proj.weight",
    "input_layernorm.weight",
    "mlp_res_norm.weight",
    "mlp_res_proj.weight",
    "post_attention_layernorm.weight",
    "self_attention_res_norm.weight",
    "self_attention_res_proj.weight",
    "self_attn.A_log",
    "self_attn.b_proj.weight",
    "self_attn.dt_bias",
    "self_attn.f_a_proj.weight",
    "self_attn.f_b_proj.weight",
    "self_attn.g_proj.weight",
    "self_attn.k_conv1d.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_norm.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_conv1d.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_conv1d.weight",
    "self_attn.v_proj.weight",
};

// Expert sub-tensors in canonical order (DESIGN.md §5), with tiny MXFP4-like shapes.
struct Sub {
  const char* suffix;
  std::vector<uint64_t> shape;
};
const Sub kExpertSubs[] = {
    {"w1.weight_packed", {4, 16}}, {"w1.weight_scale", {4, 1}},
    {"w2.weight_packed", {4, 16}}, {"w2.weight_scale", {4, 1}},
    {"w3.weight_packed", {4, 16}}, {"w3.weight_scale", {4, 1}},
};

k3::Status WriteShard(const std::string& path, int layer) {
  const std::string prefix = "language_model.model.layers." + std::to_string(layer) + ".";
  k3::st::Writer w(k3::Env::Default(), path);
  w.SetMetadata({{"format", "pt"}});
  uint64_t bytes = 0;
  for (const char* name : kTrunk) {
    w.Add(prefix + name, k3::DType::kBF16, {4, 4});
    bytes += 32;
  }
  for (int e = 0; e < kExperts; ++e) {
    const std::string expert = prefix + "block_sparse_moe.experts." + std::to_string(e) + ".";
    for (const Sub& s : kExpertSubs) {
      w.Add(expert + s.suffix, k3::DType::kU8, s.shape);
      bytes += *k3::st::CheckedByteSize(k3::DType::kU8, s.shape);
    }
  }
  K3_RETURN_IF_ERROR(w.Begin());
  const std::string data(static_cast<size_t>(bytes), '\x11');
  K3_RETURN_IF_ERROR(w.Append(data.data(), data.size()));
  return w.Finish();
}

// The minimum work any SAX consumer does: accept every event.
struct NullSax {
  using json = nlohmann::json;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool key(std::string&) { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }
};

// The header JSON of a shard (after the 8-byte prefix), as Open will read it.
std::string HeaderBytes(const std::string& path) {
  const k3::Result<std::string> file = k3::ReadFileToString(k3::Env::Default(), path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    std::exit(1);
  }
  uint64_t n = 0;
  for (size_t i = 8; i-- > 0;) n = (n << 8) | static_cast<unsigned char>((*file)[i]);
  return file->substr(8, static_cast<size_t>(n));
}

double ThreadCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stopwatch {
  Clock::time_point wall0 = Clock::now();
  double cpu0 = ThreadCpuSeconds();
};

// The best (smallest) wall and CPU time seen over the rounds.
struct Timing {
  double wall = 1e30;
  double cpu = 1e30;
  void Keep(const Stopwatch& w) {
    wall = std::min(wall, std::chrono::duration<double>(Clock::now() - w.wall0).count());
    cpu = std::min(cpu, ThreadCpuSeconds() - w.cpu0);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int shards = 8;
  int repeat = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--shards" && i + 1 < argc) {
      shards = std::atoi(argv[++i]);
    } else if (arg == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--dir DIR] [--shards N] [--repeat R]\n", argv[0]);
      return 2;
    }
  }
  if (shards < 1 || repeat < 1) {
    std::fprintf(stderr, "--shards and --repeat must be at least 1\n");
    return 2;
  }
  bool temp_dir = false;
  if (dir.empty()) {
    char templ[] = "/tmp/k3-bench-index-XXXXXX";
    if (::mkdtemp(templ) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = templ;
    temp_dir = true;
  }
  k3::Env* env = k3::Env::Default();
  if (const k3::Status s = env->MakeDirs(dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }

  std::vector<std::string> paths;
  for (int i = 0; i < shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%06d.safetensors", i + 1, shards);
    paths.push_back(k3::JoinPath(dir, name));
    if (const k3::Status s = WriteShard(paths.back(), i + 3); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<std::string> headers;
  uint64_t header_bytes = 0;
  for (const std::string& p : paths) {
    headers.push_back(HeaderBytes(p));
    header_bytes += headers.back().size();
  }

  // (a) and (b) alternate within each round so that both see the same machine load; each
  // reports its best round. (a) is the raw SAX rate over the same header bytes, already in
  // memory; (b) is the real thing, files included (page cache warm after the first round).
  // Both wall time and this thread's CPU time (user + system) are kept: on a shared machine
  // the CPU time is the steadier measure, as preemption by other processes does not count.
  Timing sax, open;
  size_t tensors = 0;
  for (int r = 0; r < repeat; ++r) {
    Stopwatch w;
    for (const std::string& h : headers) {
      NullSax handler;
      if (!nlohmann::json::sax_parse(h.data(), h.data() + h.size(), &handler)) {
        std::fprintf(stderr, "raw SAX parse failed\n");
        return 1;
      }
    }
    sax.Keep(w);

    Stopwatch w2;
    k3::Result<k3::st::CheckpointIndex> index = k3::st::CheckpointIndex::Open(env, dir);
    open.Keep(w2);
    if (!index.ok()) {
      std::fprintf(stderr, "%s\n", index.status().ToString().c_str());
      return 1;
    }
    tensors = index->tensor_count();
  }

  const double mb = static_cast<double>(header_bytes) / 1e6;
  const double n = static_cast<double>(tensors);
  std::printf("machine: %d cores usable\n", k3::CoreCount());
  std::printf("shards: %d in %s, %zu tensors (%.0f per shard), %.3f MB of header JSON "
              "(%.0f bytes per tensor), best of %d rounds\n",
              shards, dir.c_str(), tensors, n / shards, mb,
              static_cast<double>(header_bytes) / n, repeat);
  std::printf("(a) raw nlohmann SAX, null handler: wall %.4f s = %6.1f MB/s | cpu %.4f s = "
              "%6.1f MB/s\n",
              sax.wall, mb / sax.wall, sax.cpu, mb / sax.cpu);
  std::printf("(b) CheckpointIndex::Open:          wall %.4f s = %6.1f MB/s | cpu %.4f s = "
              "%6.1f MB/s, %.0f tensors/s (wall), %.0f tensors/s (cpu)\n",
              open.wall, mb / open.wall, open.cpu, mb / open.cpu, n / open.wall, n / open.cpu);
  std::printf("(b)/(a) = %.1f %% by wall time, %.1f %% by CPU time (aim >= 80 %%)\n",
              100.0 * sax.wall / open.wall, 100.0 * sax.cpu / open.cpu);

  if (temp_dir) {
    for (const std::string& p : paths) (void)env->Remove(p);
    (void)env->Remove(dir);
  }
  return 0;
}
