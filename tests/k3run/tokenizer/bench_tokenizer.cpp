// Encode throughput on the multilingual corpus (tests/data/corpus/*.txt): ours vs npm tiktoken
// (WASM build of the Rust core) on the same input, same machine, same vocabulary (o200k_base
// ranks + the 256 K3 added tokens, the Kimi pattern). Prints MB/s for both and the ratio.
//
// Usage: k3_bench_tokenizer [--seconds S]   (node + tests/k3run/tokenizer/parity/node_modules
// are needed for the comparison; without them only our rate is printed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "k3prep/synth/tokenizer.h"
#include "k3run/text/tokenizer.h"

namespace {

const std::string kSource = K3_SOURCE_DIR;
const std::string kParity = kSource + "/tests/k3run/tokenizer/parity";

std::string Read(const std::string& path) {
  k3::Result<std::string> s = k3::ReadFileToString(k3::Env::Default(), path);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *s;
}

int Run(double seconds) {
  const std::string o200k = kParity + "/node_modules/tiktoken/encoders/o200k_base.json";
  if (!std::filesystem::exists(o200k)) {
    std::fprintf(stderr, "k3_bench_tokenizer: %s missing: run scripts/setup.sh (npm install)\n", o200k.c_str());
    return 1;
  }
  // Vocabulary: o200k ranks as tiktoken.model + the K3 added tokens after them.
  const std::string ranks = nlohmann::json::parse(Read(o200k)).at("bpe_ranks").get<std::string>();
  std::string model;
  int64_t rank = -2;  // the first two fields are the marker and the first rank
  for (size_t at = 0; at < ranks.size();) {
    size_t sp = ranks.find(' ', at);
    if (sp == std::string::npos) sp = ranks.size();
    if (rank >= 0) model.append(ranks, at, sp - at).append(" ").append(std::to_string(rank)).append("\n");
    ++rank;
    at = sp + 1;
  }
  k3::Result<k3::tiktoken::Vocab> vocab = k3::tiktoken::ParseTiktokenModel(model, "o200k_base");
  k3::Result<k3::synth::SynthTokenizer> synth = k3::synth::BuildSynthTokenizer(k3::synth::kMinVocab);
  if (!vocab.ok() || !synth.ok()) {
    std::fprintf(stderr, "k3_bench_tokenizer: cannot build the vocabulary\n");
    return 1;
  }
  k3::tiktoken::TokenizerConfig config = synth->config;
  for (size_t k = 0; k < config.added_tokens.size(); ++k) {
    config.added_tokens[k].id = rank + static_cast<int64_t>(k);
  }
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / ("k3_bench_tokenizer." + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string model_path = (tmp / "tiktoken.model").string();
  const std::string specials_path = (tmp / "specials.json").string();
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& t : config.added_tokens) specials[t.content] = t.id;
  if (!k3::WriteFileAtomic(k3::Env::Default(), model_path, model).ok() ||
      !k3::WriteFileAtomic(k3::Env::Default(), specials_path, specials.dump()).ok()) {
    std::fprintf(stderr, "k3_bench_tokenizer: cannot write %s\n", tmp.c_str());
    return 1;
  }
  k3::Result<k3::tok::Tokenizer> tok = k3::tok::Tokenizer::FromParts(*vocab, config, 0, "o200k_base");
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }

  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(kSource + "/tests/data/corpus")) {
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const auto& f : files) {
    texts.push_back(Read(f));
    bytes += texts.back().size();
  }

  // Ours: whole corpus, repeated until `seconds` have passed (one warm-up round first).
  size_t ids = 0;
  for (const auto& t : texts) ids += tok->Encode(t, true).size();
  size_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (const auto& t : texts) ids += tok->Encode(t, true).size();
    total += bytes;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  const double ours = static_cast<double>(total) / 1e6 / elapsed;
  std::printf("corpus: %zu files, %zu bytes\n", files.size(), bytes);
  std::printf("k3 tokenizer:  %.3f MB/s (%zu bytes in %.3f s)\n", ours, total, elapsed);

  // npm tiktoken: the same files through parity/encode.mjs bench (same split and specials).
  std::string cmd = "cd '" + kParity + "' && node encode.mjs bench '" + model_path + "' '" + specials_path +
                    "' '" + kSource + "/tests/k3run/tokenizer/data/tokenizer-pattern.txt' " + std::to_string(seconds);
  for (const auto& f : files) cmd += " '" + f + "'";
  FILE* p = popen(cmd.c_str(), "r");
  char line[512] = {0};
  const bool got = p != nullptr && std::fgets(line, sizeof line, p) != nullptr;
  if (p != nullptr) pclose(p);
  std::filesystem::remove_all(tmp);
  double theirs = 0;
  const char* m = got ? std::strstr(line, "mbps=") : nullptr;
  if (m == nullptr || (theirs = std::atof(m + 5)) <= 0) {
    std::printf("npm tiktoken: not measured (node or the npm package missing)\n");
    return 1;
  }
  std::printf("npm tiktoken:  %.3f MB/s (%s", theirs, line);
  std::printf("ratio (ours / npm tiktoken): %.2fx\n", ours / theirs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3.0;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: k3_bench_tokenizer [--seconds S]\n");
      return 2;
    }
  }
  return Run(seconds);
}
