// k3run's command line: validation, the memory plan, generation, output (see cli.h).
#include "k3run/cli.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "common/log.h"
#include "common/sysinfo.h"
#include "formats/prepared_manifest.h"
#include "k3run/detokenize.h"
#include "k3run/generate.h"
#include "k3run/kernels/matmul.h"
#include "k3run/model.h"
#include "k3run/plan.h"
#include "k3run/report.h"
#include "k3run/utf8.h"
#include "k3run/weights.h"

namespace k3::run {
namespace {

static_assert(std::endian::native == std::endian::little,
              "--dump-logits writes float32 little-endian by copying memory");

Status WriteFd1(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(1, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoErrno("write", "stdout", errno);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

// --dump-logits: written under a temporary name and renamed when complete, so a failed run never
// leaves a plausible-looking dump.
class LogitsDump {
 public:
  static Result<std::unique_ptr<LogitsDump>> Open(Env* env, const std::string& path) {
    auto d = std::unique_ptr<LogitsDump>(new LogitsDump(env, path));
    K3_ASSIGN_OR_RETURN(d->file_, env->Open(TempPathFor(path), OpenMode::kCreate));
    d->writer_ = std::make_unique<BufferedWriter>(d->file_.get());
    return d;
  }
  ~LogitsDump() {
    if (!done_) {
      writer_.reset();
      file_.reset();
      (void)env_->Remove(TempPathFor(path_));
    }
  }
  Status Append(const float* logits, int64_t n) {
    return writer_->Append(logits, static_cast<size_t>(n) * sizeof(float));
  }
  Status Finish() {
    K3_RETURN_IF_ERROR(writer_->Flush());
    K3_RETURN_IF_ERROR(file_->Sync());
    K3_RETURN_IF_ERROR(file_->Close());
    K3_RETURN_IF_ERROR(env_->Rename(TempPathFor(path_), path_));
    done_ = true;
    return Status::Ok();
  }

 private:
  LogitsDump(Env* env, std::string path) : env_(env), path_(std::move(path)) {}
  Env* env_;
  std::string path_;
  std::unique_ptr<File> file_;
  std::unique_ptr<BufferedWriter> writer_;
  bool done_ = false;
};

Result<prep::PreparedDir> OpenForRun(Env* env, const RunOptions& o) {
  prep::OpenOptions open;
  open.model_dir = o.model_dir;
  Result<prep::PreparedDir> p = prep::OpenPrepared(env, o.prepared, open);
  if (!p.ok() && p.status().code() == Code::kIntegrity) {
    // k3run treats a manifest that fails its sum as untrusted input (DESIGN.md §5): exit 2.
    return Status::Invalid("untrusted manifest: " + p.status().message() +
                           " (run k3verify prepared, or re-run k3prep pack)");
  }
  return p;
}

}  // namespace

Result<std::vector<int32_t>> ParseIdList(std::string_view text, std::string_view flag) {
  std::vector<int32_t> ids;
  size_t pos = 0, item = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string_view tok =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    ++item;
    bool ok = !tok.empty() && tok.size() <= 10;
    uint64_t v = 0;
    for (char ch : tok) {
      if (ch < '0' || ch > '9') ok = false;
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    if (!ok || v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return Status::Invalid(std::string(flag) + ": item " + std::to_string(item) + " (\"" +
                             std::string(tok) +
                             "\") is not a token id; expected comma-separated non-negative "
                             "integers like 1,2,3");
    }
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return ids;
}

Status CheckIdsInVocab(const std::vector<int64_t>& ids, int64_t vocab, std::string_view flag,
                       const std::string& source) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Status::Invalid(std::string(flag) + ": id " + std::to_string(ids[i]) +
                             " (item " + std::to_string(i + 1) + ") is outside the vocabulary " +
                             "[0, " + std::to_string(vocab) + ") of " + source);
    }
  }
  return Status::Ok();
}

Status RunK3run(const RunOptions& o, const CliIo& io) {
  Env* env = io.env ? io.env : Env::Default();
  const auto out = io.write_stdout ? io.write_stdout : WriteFd1;
  const bool lines = !o.output.quiet && o.output.progress != ProgressMode::kNone;

  // 1. Everything that needs no weights.
  K3_ASSIGN_OR_RETURN(kernels::Isa isa, kernels::IsaFromEnvironment());
  kernels::SetIsa(isa);
  if (o.threads > 0) kernels::SetThreads(o.threads);
  if (o.ids.empty()) {
    return Status::Invalid("no prompt: give token ids with --ids 1,2,3");
  }
  K3_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIdList(o.ids, "--ids"));
  if (o.gen < 0) return Status::Invalid("--gen " + std::to_string(o.gen) + ": must be >= 0");

  // 2. The prepared directory, then the ids and limits against its config.
  K3_ASSIGN_OR_RETURN(prep::PreparedDir prepared, OpenForRun(env, o));
  const ModelConfig& c = prepared.manifest.config;
  const std::string manifest = JoinPath(o.prepared, "k3.json");
  K3_RETURN_IF_ERROR(CheckIdsInVocab(std::vector<int64_t>(prompt.begin(), prompt.end()), c.vocab,
                                     "--ids", manifest));
  K3_RETURN_IF_ERROR(CheckIdsInVocab(o.stop_ids, c.vocab, "--stop-id", manifest));
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P > kMaxPositions || o.gen > kMaxPositions - P) {
    return Status::Invalid("--gen " + std::to_string(o.gen) + " with a prompt of " +
                           std::to_string(P) + " ids needs " + std::to_string(P + o.gen) +
                           " positions; the limit is " + std::to_string(kMaxPositions) +
                           " (max_position_embeddings): lower --gen or shorten --ids");
  }
  const int layers = o.layers == 0 ? c.n_layers : o.layers;
  if (layers < 1 || layers > c.n_layers) {
    return Status::Invalid("--layers " + std::to_string(o.layers) + ": must be in [1, " +
                           std::to_string(c.n_layers) + "] (the model has " +
                           std::to_string(c.n_layers) + " layers)");
  }

  // 3. The memory plan, before anything large is allocated.
  RamWeightsOptions wopt;
  wopt.verify_reads = o.verify_reads;
  K3_ASSIGN_OR_RETURN(std::unique_ptr<RamWeights> weights,
                      RamWeights::Open(env, &prepared, wopt));
  const MemoryPlan plan = PlanMemory(c, layers, PositionsNeeded(P, o.gen),
                                     weights->PlannedResidentBytes());
  K3_ASSIGN_OR_RETURN(uint64_t avail, io.mem_available ? io.mem_available() : MemAvailableBytes());
  K3_RETURN_IF_ERROR(CheckMemory(plan, avail));
  if (lines) {
    LogInfo("plan: KV cache " + FormatGb(plan.kv_cache_bytes) + " for " +
            std::to_string(plan.positions) + " positions, recurrent state " +
            FormatGb(plan.state_bytes) + ", weights held " + FormatGb(plan.weights_bytes) +
            "; MemAvailable " + FormatGb(avail) + "; ISA " + kernels::IsaName(isa) +
            ", threads " + std::to_string(kernels::Threads()));
    if (layers != c.n_layers) {
      LogWarn("--layers " + std::to_string(layers) + ": running the first " +
              std::to_string(layers) + " of " + std::to_string(c.n_layers) +
              " layers: this is NOT the model");
    }
  }

  // 4. Outputs that can fail before the run starts.
  K3_ASSIGN_OR_RETURN(std::optional<Detokenizer> detok, Detokenizer::Load(env, prepared));
  std::unique_ptr<LogitsDump> dump;
  if (!o.dump_logits.empty()) {
    K3_ASSIGN_OR_RETURN(dump, LogitsDump::Open(env, o.dump_logits));
  }

  // 5. Generate, streaming the bytes to stdout as they are decided.
  Model model(c, weights.get(), layers);
  GenerateOptions g;
  g.prompt = prompt;
  g.gen = o.gen;
  g.recompute = o.recompute;
  g.stop_ids = o.stop_ids;
  Utf8Chunker chunker;
  std::string text;
  auto on_step = [&](const StepRecord& s, const float* logits) -> Status {
    if (lines) LogInfo(StepLine(s));
    if (dump && (o.dump_all || s.index == 0)) K3_RETURN_IF_ERROR(dump->Append(logits, c.vocab));
    if (s.token < 0) return Status::Ok();
    if (detok) {
      const std::string bytes = detok->Bytes(s.token);
      text += bytes;
      const std::string ready = chunker.Push(bytes);
      if (!ready.empty()) K3_RETURN_IF_ERROR(out(ready));
    } else {
      K3_RETURN_IF_ERROR(out(std::to_string(s.token) + "\n"));
    }
    return Status::Ok();
  };
  K3_ASSIGN_OR_RETURN(GenerateResult result, Generate(&model, weights.get(), g, on_step));
  const std::string tail = chunker.Flush();
  if (!tail.empty()) K3_RETURN_IF_ERROR(out(tail));
  if (dump) K3_RETURN_IF_ERROR(dump->Finish());

  // 6. The report.
  RunReport r;
  r.prepared = o.prepared;
  r.layers_run = layers;
  r.n_layers = c.n_layers;
  r.recompute = o.recompute;
  r.isa = kernels::IsaName(isa);
  r.threads = kernels::Threads();
  r.prompt_ids = prompt;
  r.generated_ids = result.generated;
  if (detok) r.generated_bytes = text;
  r.stopped_by_id = result.stopped_by_id;
  r.steps = result.steps;
  r.plan = plan;
  r.peak_rss_bytes = PeakRssBytes();
  r.experts_skipped = model.experts_skipped();
  r.failures = weights->Failures();
  if (!o.out.empty()) K3_RETURN_IF_ERROR(WriteFileAtomic(env, o.out, RenderReportJson(r)));
  if (lines) LogInfo(SummaryLines(r));

  if (r.experts_skipped > 0 || !r.failures.empty()) {
    std::string msg = "RUN INVALID: " + std::to_string(r.failures.size()) +
                      " expert(s) could not be used (" + std::to_string(r.experts_skipped) +
                      " token-expert pairs skipped); the generated ids are not trustworthy:";
    for (const ExpertFailure& f : r.failures) {
      msg += "\n  layer " + std::to_string(f.layer) + " expert " + std::to_string(f.expert) +
             ": " + f.reason;
    }
    return Status::Unreliable(msg);
  }
  return Status::Ok();
}

void AddRunFlags(CLI::App* app, RunOptions* o) {
  app->add_option("PREPARED", o->prepared, "prepared directory (k3prep pack)")->required();
  app->add_option("--ids", o->ids, "prompt token ids, comma-separated: 1,2,3");
  app->add_option("--gen", o->gen, "tokens to generate (0: prefill only)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--recompute", o->recompute,
                "re-run the whole prefix every step (the check path; same bits, O(T^2))");
  app->add_option("--stop-id", o->stop_ids, "stop after generating this id (repeatable)");
  app->add_option("--layers", o->layers, "run only the first N layers (NOT the model)")
      ->check(CLI::PositiveNumber);
  app->add_option("--threads", o->threads, "compute threads (never changes a bit)")
      ->check(CLI::PositiveNumber);
  CLI::Option* dump = app->add_option(
      "--dump-logits", o->dump_logits,
      "write the prompt's final logits (float32 little-endian, all vocab) to PATH");
  app->add_flag("--dump-logits-all", o->dump_all, "dump the logits of every step, in order")
      ->needs(dump);
  app->add_option("--out", o->out, "write the JSON report to FILE");
  app->add_option("--model-dir", o->model_dir, "where the link-mode shards live now");
  app->add_flag("--verify-reads", o->verify_reads,
                "hash every expert read against experts.idx (a mismatch: exit 4)");
  AddOutputFlags(app, &o->output);
}

int K3runMain(int argc, char** argv, const CliIo& io) {
  CLI::App app("k3run: greedy generation with Kimi K3 from a prepared directory", "k3run");
  RunOptions o;
  AddRunFlags(&app, &o);
  return RunCli(app, argc, argv, [&] { return RunK3run(o, io); });
}

}  // namespace k3::run
