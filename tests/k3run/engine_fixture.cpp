#include "tests/k3run/engine_fixture.h"

#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "common/hash.h"
#include "formats/experts_index.h"
#include "k3run/engine/generate.h"
#include "tests/support/synth_fixture.h"

namespace k3::run::testing {

namespace {
test::FixtureSpec SeedZeroCopy(const char* preset) {
  return {preset, 0, prepared::ExpertsMode::kCopy};
}
}  // namespace

// Built once per CTest run (tests/support/synth_fixture.h), shared read-only by every process.
const std::string& TinyCheckpointDir() {
  return test::SynthFixture(SeedZeroCopy("tiny")).checkpoint;
}

const tok::Tokenizer& TinyTokenizer() {
  static const std::unique_ptr<tok::Tokenizer> t = [] {
    Result<tok::Tokenizer> r =
        tok::Tokenizer::Load(Env::Default(), JoinPath(TinyCheckpointDir(), "tiktoken.model"),
                             JoinPath(TinyCheckpointDir(), "tokenizer_config.json"), 1280);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::make_unique<tok::Tokenizer>(std::move(r).value());
  }();
  return *t;
}
const std::string& TinyPreparedDir() { return test::SynthFixture(SeedZeroCopy("tiny")).prepared; }
const std::string& SmallPreparedDir() { return test::SynthFixture(SeedZeroCopy("small")).prepared; }

std::string CopyTinyWithoutVision(const std::string& dst) {
  std::filesystem::copy(TinyPreparedDir(), dst, std::filesystem::copy_options::recursive);
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(Env::Default(), dst);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return dst;
  prepared::Manifest m = p->manifest;
  m.vision.reset();
  std::erase_if(m.regions, [](const prepared::Region& r) { return r.file == "vision.bin"; });
  std::erase_if(m.files, [](const prepared::FileEntry& f) { return f.path == "vision.bin"; });
  const Status s = prepared::WriteManifestAndSum(Env::Default(), dst, m);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dst;
}

std::string CopyTinyWithCorruptExperts(const std::string& dst, int layer) {
  std::filesystem::copy(TinyPreparedDir(), dst, std::filesystem::copy_options::recursive);
  Result<std::string> bytes = ReadFileToString(Env::Default(), dst + "/experts.idx");
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<prepared::ExpertsIndex> idx =
      prepared::DecodeExpertsIndex(bytes.ok() ? *bytes : std::string(), "experts.idx");
  EXPECT_TRUE(idx.ok()) << idx.status().ToString();
  if (!idx.ok()) return dst;
  for (uint32_t e = 0; e < idx->n_experts; ++e) {
    const prepared::ExpertRecord& rec = idx->At(static_cast<uint32_t>(layer), e);
    std::fstream f(dst + "/" + idx->files[rec.file_id],
                   std::ios::in | std::ios::out | std::ios::binary);
    EXPECT_TRUE(f.good());
    f.seekg(static_cast<std::streamoff>(rec.offset + 10));
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x5A);
    f.seekp(static_cast<std::streamoff>(rec.offset + 10));
    f.write(&ch, 1);
  }
  return dst;
}

std::unique_ptr<Engine> OpenEngine(const std::string& dir, Env* env, RamWeightsOptions options) {
  auto e = std::make_unique<Engine>();
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(env, dir);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  e->prepared = std::move(p).value();
  Result<std::unique_ptr<RamWeights>> w = RamWeights::Open(env, &e->prepared, options);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return nullptr;
  e->weights = std::move(w).value();
  return e;
}

std::vector<int32_t> GenerateThrough(WeightSource* w, const ModelConfig& c, int layers,
                                     const std::vector<int32_t>& prompt, int64_t gen,
                                     bool recompute, std::vector<float>* logits,
                                     int64_t* experts_skipped) {
  const int64_t positions = PositionsNeeded(static_cast<int64_t>(prompt.size()), gen);
  std::unique_ptr<run::Engine> engine = run::Engine::WithSource(c, w, layers, positions);
  std::unique_ptr<Sequence> seq = engine->NewSequence();
  GenerateOptions o;
  o.prompt = prompt;
  o.gen = gen;
  o.recompute = recompute;
  Result<GenerateResult> r =
      Generate(engine.get(), seq.get(), o, [&](const StepRecord&, const float* l) {
        logits->insert(logits->end(), l, l + c.vocab);
        return Status::Ok();
      });
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (experts_skipped != nullptr) *experts_skipped = engine->experts_skipped();
  return r.ok() ? r->generated : std::vector<int32_t>{};
}

std::vector<int32_t> GenerateLogits(Engine* e, const std::vector<int32_t>& prompt, int64_t gen,
                                    bool recompute, std::vector<float>* logits, int layers) {
  return GenerateThrough(e->weights.get(), e->prepared.manifest.config, layers, prompt, gen,
                         recompute, logits);
}

std::string CliRun::stdout_text() const {
  std::string s;
  for (const std::string& w : stdout_writes) s += w;
  return s;
}

CliRun RunCliArgs(const std::vector<std::string>& args, CliIo io) {
  CliRun run;
  io.write_stdout = [&](std::string_view b) {
    run.stdout_writes.emplace_back(b);
    return Status::Ok();
  };
  std::vector<std::string> owned = {"k3run"};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  run.exit_code = K3runMain(static_cast<int>(argv.size()), argv.data(), io);
  run.stderr_text = ::testing::internal::GetCapturedStderr();
  return run;
}

CliIo Stdin(std::vector<std::string> lines) {
  auto q = std::make_shared<std::deque<std::string>>(lines.begin(), lines.end());
  CliIo io;
  io.read_line = [q]() -> std::optional<std::string> {
    if (q->empty()) return std::nullopt;
    std::string l = q->front();
    q->pop_front();
    return l;
  };
  return io;
}

PlanOptions ContextPlan(int64_t positions) {
  PlanOptions po;
  po.positions = positions;
  po.pass_rows = positions;
  return po;
}

std::unique_ptr<run::Engine> OpenPlanned(const std::string& dir, const PlanOptions& po) {
  Result<std::unique_ptr<run::Engine>> e = run::Engine::Open(Env::Default(), dir);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  const Status planned = (*e)->Plan(po);
  EXPECT_TRUE(planned.ok()) << planned.ToString();
  if (!planned.ok()) return nullptr;
  const Status loaded = (*e)->LoadWeights();
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  if (!loaded.ok()) return nullptr;
  return std::move(e).value();
}

MediaSpan SpanOfTokens(run::Engine* e, const std::vector<int32_t>& tokens, int64_t first) {
  const int64_t E = e->config().hidden;
  auto rows = std::make_shared<std::vector<float>>(tokens.size() * static_cast<size_t>(E));
  EXPECT_TRUE(e->weight_source()
                  ->EmbeddingRows(tokens.data(), static_cast<int64_t>(tokens.size()), rows->data())
                  .ok());
  MediaSpan s;
  s.first = first;
  s.rows = static_cast<int64_t>(tokens.size());
  s.id = Xxh3_128(rows->data(), rows->size() * sizeof(float));
  s.data = rows;
  return s;
}

}  // namespace k3::run::testing
