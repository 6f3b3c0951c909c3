// k3run's command line: validation, the memory plan, generation, output (see cli.h).
#include "k3run/app/cli.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>

#include "common/log.h"
#include "common/sysinfo.h"
#include "formats/prepared_manifest.h"
#include "k3run/app/chat_session.h"
#include "k3run/text/chat_template.h"
#include "k3run/stream/cache_trace.h"
#include "k3run/text/detokenize.h"
#include "k3run/app/floor.h"
#include "k3run/engine/generate.h"
#include "k3run/kernels/matmul.h"
#include "k3run/engine/model.h"
#include "k3run/stream/memory_plan.h"
#include "k3run/app/report.h"
#include "k3run/engine/sampler.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/text/tokenizer.h"
#include "k3run/text/utf8.h"
#include "k3run/weights/weights.h"

namespace k3::run {
namespace {

// Chat plans its KV cache for a fixed context (upstream's serve default) rather than the model's
// 1 Mi positions; every turn's rendered transcript + --gen must fit in it.
constexpr int64_t kChatContext = 8192;
constexpr int64_t kChatDefaultGen = 2048;

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

Result<prepared::PreparedDir> OpenForRun(Env* env, const RunOptions& o) {
  prepared::OpenOptions open;
  open.model_dir = o.model_dir;
  Result<prepared::PreparedDir> p = prepared::OpenPrepared(env, o.prepared, open);
  if (!p.ok() && p.status().code() == Code::kIntegrity) {
    // k3run treats a manifest that fails its sum as untrusted input (DESIGN.md §5): exit 2.
    return Status::Invalid("untrusted manifest: " + p.status().message() +
                           " (run k3verify prepared, or re-run k3prep pack)");
  }
  return p;
}

// Reads fd 0 a line at a time (the REPL's default input).
std::optional<std::string> ReadLineFd0() {
  std::string line;
  char ch = 0;
  while (true) {
    const ssize_t n = ::read(0, &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return line.empty() ? std::nullopt : std::optional<std::string>(line);
    if (ch == '\n') return line;
    line += ch;
  }
}

// Which prompt source the flags chose; exactly one is required.
Status CheckModes(const RunOptions& o) {
  const int sources = (!o.ids.empty() ? 1 : 0) + (o.prompt ? 1 : 0) + (o.prompt_file ? 1 : 0) +
                      (o.chat ? 1 : 0);
  if (sources == 0) {
    return Status::Invalid("no prompt: give --ids 1,2,3, --prompt TEXT, --prompt-file PATH or "
                           "--chat");
  }
  if (sources > 1) {
    return Status::Invalid("--ids, --prompt, --prompt-file and --chat are exclusive: give "
                           "exactly one");
  }
  if (!o.chat) {
    const char* chat_only = o.system ? "--system"
                            : !o.history.empty() ? "--history"
                            : o.no_think ? "--no-think"
                            : o.effort ? "--thinking-effort"
                                       : nullptr;
    if (chat_only) return Status::Invalid(std::string(chat_only) + " needs --chat");
  } else {
    const char* not_chat = !o.dump_logits.empty() ? "--dump-logits"
                           : !o.out.empty()       ? "--out"
                           : !o.stop_ids.empty()  ? "--stop-id"
                           : o.recompute          ? "--recompute"
                                                  : nullptr;
    if (not_chat) {
      return Status::Invalid(std::string(not_chat) + " cannot be used with --chat (chat stops "
                             "at [EOS] or <|end_of_msg|> and writes no report)");
    }
    if (o.no_think && o.effort) {
      return Status::Invalid("--no-think and --thinking-effort contradict each other: give one");
    }
    if (o.effort) K3_RETURN_IF_ERROR(ValidateEffort(*o.effort));
    if (o.gen <= 0) return Status::Invalid("--gen " + std::to_string(o.gen) + ": chat needs > 0");
  }
  return ValidateSamplerOptions(o.sampling);
}

// The prepared directory's tokenizer: the Detokenizer load checks both files' XXH3-128 against
// k3.json (kIntegrity on a mismatch) before the encoder parses them.
Result<tok::Tokenizer> LoadTokenizer(Env* env, const prepared::PreparedDir& p, const char* flag) {
  K3_ASSIGN_OR_RETURN(std::optional<Detokenizer> checked, Detokenizer::Load(env, p));
  const prepared::Region* model = p.manifest.FindRegion("tokenizer/tiktoken.model");
  const prepared::Region* config = p.manifest.FindRegion("tokenizer/tokenizer_config.json");
  if (!checked || model == nullptr || config == nullptr) {
    return Status::Invalid(std::string(flag) + " needs a tokenizer, and " + p.dir +
                           " has no tokenizer/tiktoken.model and tokenizer_config.json: pack "
                           "a checkpoint that has them, or give --ids");
  }
  return tok::Tokenizer::Load(env, JoinPath(p.dir, model->file), JoinPath(p.dir, config->file),
                              p.manifest.config.vocab);
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

Status RunK3run(const RunOptions& options, const CliIo& io) {
  RunOptions o = options;
  if (o.chat && !o.gen_set) o.gen = kChatDefaultGen;
  Env* env = io.env ? io.env : Env::Default();
  const auto out = io.write_stdout ? io.write_stdout : WriteFd1;
  const bool lines = !o.output.quiet && o.output.progress != ProgressMode::kNone;

  // 1. Everything that needs no weights.
  K3_ASSIGN_OR_RETURN(kernels::Isa isa, kernels::IsaFromEnvironment());
  kernels::SetIsa(isa);
  if (o.threads > 0) kernels::SetThreads(o.threads);
  K3_RETURN_IF_ERROR(CheckModes(o));
  std::vector<int32_t> prompt;
  if (!o.ids.empty()) {
    K3_ASSIGN_OR_RETURN(prompt, ParseIdList(o.ids, "--ids"));
  }
  std::string prompt_text;
  if (o.prompt) prompt_text = *o.prompt;
  if (o.prompt_file) {
    Result<std::string> text = ReadFileToString(env, *o.prompt_file, uint64_t{1} << 30);
    // An unreadable input is a usage error (exit 2, DESIGN.md §6), whatever errno said.
    if (!text.ok()) return Status::Invalid("--prompt-file: " + text.status().message());
    prompt_text = std::move(text).value();
  }
  if (o.gen < 0) return Status::Invalid("--gen " + std::to_string(o.gen) + ": must be >= 0");

  // 2. The prepared directory, then the ids and limits against its config.
  K3_ASSIGN_OR_RETURN(prepared::PreparedDir prepared, OpenForRun(env, o));
  const ModelConfig& c = prepared.manifest.config;
  const std::string manifest = JoinPath(o.prepared, "k3.json");
  const char* mode = o.chat ? "--chat" : o.prompt ? "--prompt" : o.prompt_file ? "--prompt-file"
                                                                             : "--ids";
  std::optional<tok::Tokenizer> tokenizer;
  if (o.ids.empty()) {
    K3_ASSIGN_OR_RETURN(tok::Tokenizer t, LoadTokenizer(env, prepared, mode));
    tokenizer.emplace(std::move(t));
  }
  if (!o.chat && o.ids.empty()) {
    // Prompts from the user's own text may name special tokens (the upstream default).
    prompt = tokenizer->Encode(prompt_text, /*allow_special=*/true);
    if (prompt.empty()) {
      return Status::Invalid(std::string(mode) + ": the prompt is empty (0 ids); give some text");
    }
  }
  K3_RETURN_IF_ERROR(CheckIdsInVocab(std::vector<int64_t>(prompt.begin(), prompt.end()), c.vocab,
                                     mode, manifest));
  K3_RETURN_IF_ERROR(CheckIdsInVocab(o.stop_ids, c.vocab, "--stop-id", manifest));
  if (o.chat && o.gen >= kChatContext) {
    return Status::Invalid("--gen " + std::to_string(o.gen) + ": chat plans a context of " +
                           std::to_string(kChatContext) + " positions, so --gen must be below it");
  }
  // Chat plans for the longest transcript a turn may render within the context.
  const int64_t P = o.chat ? kChatContext - o.gen : static_cast<int64_t>(prompt.size());
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
  BudgetRequest budget;
  budget.budget_gb = o.budget_gb;
  budget.trunk_gb = o.trunk_gb;
  budget.cache_gb = o.cache_gb;
  budget.preset = o.preset;
  if (o.cache_policy) {
    K3_ASSIGN_OR_RETURN(budget.policy, ParseCachePolicy(*o.cache_policy));
    if (!budget.any()) {
      return Status::Invalid("--cache-policy needs a memory budget (--budget-gb, --preset, "
                             "--trunk-gb or --cache-gb); without one every expert is held");
    }
  }
  K3_ASSIGN_OR_RETURN(uint64_t avail, io.mem_available ? io.mem_available() : MemAvailableBytes());
  std::optional<StreamingPlan> splan;
  if (budget.any()) {
    K3_ASSIGN_OR_RETURN(StreamingPlan sp, PlanStreaming(prepared, budget, avail));
    splan = std::move(sp);
  }
  std::unique_ptr<WeightSource> weights;
  // --preload is refused before any weight is loaded, probed or allocated.
  if (o.preload && !splan) {
    return Status::Invalid("--preload needs a memory budget that holds every expert (e.g. "
                           "--preset max or --budget-gb): without one experts load on first use");
  }
  if (o.preload) K3_RETURN_IF_ERROR(CheckPreloadFits(*splan, prepared));
  StreamingWeights* streaming = nullptr;
  uint64_t weights_bytes = 0;
  if (!splan) {
    RamWeightsOptions wopt;
    wopt.verify_reads = o.verify_reads;
    K3_ASSIGN_OR_RETURN(std::unique_ptr<RamWeights> ram, RamWeights::Open(env, &prepared, wopt));
    weights_bytes = ram->PlannedResidentBytes();
    weights = std::move(ram);
  } else {
    weights_bytes = splan->bytes();
  }
  const int64_t pass_rows = o.recompute ? PositionsNeeded(P, o.gen) : std::max<int64_t>(P, 1);
  const MemoryPlan plan =
      PlanMemory(c, layers, PositionsNeeded(P, o.gen), weights_bytes, pass_rows);
  if (splan && lines) LogInfo(splan->Describe());
  if (Status s = CheckMemory(plan, avail); !s.ok()) {
    if (!splan) return s;
    return Status::Invalid(s.message() + "; or lower --budget-gb / --preset");
  }
  // The bandwidth probes run before the weights are allocated: their buffers never raise the
  // peak RSS above the plan.
  std::optional<Bandwidths> bandwidths;
  if (!o.no_floor) {
    ProbeOptions po;
    po.seconds_per_probe = o.probe_seconds;
    po.max_buffer_bytes = plan.total();
    if (splan) {
      po.expert_queue_depth = std::max(1, std::min(c.topk, splan->expert_slots - 1));
      po.trunk_request_bytes = splan->ring_slot_bytes;
    } else {
      po.expert_queue_depth = std::max(1, c.topk);
    }
    Result<Bandwidths> b = ProbeBandwidths(env, prepared, po);
    if (b.ok()) {
      bandwidths = *b;
    } else if (lines) {
      LogWarn("bandwidth probe failed (the report will have no floor): " + b.status().ToString());
    }
  }
  std::unique_ptr<CacheTraceWriter> trace;
  if (!o.cache_trace_dir.empty()) {
    if (o.chat) {
      return Status::Invalid("--dump-cache-trace is not supported with --chat: trace a prompt "
                             "(--prompt, --prompt-file or --ids) instead");
    }
    if (!splan) {
      return Status::Invalid("--dump-cache-trace needs a memory budget (--budget-gb, --preset, "
                             "--trunk-gb or --cache-gb): without one there is no expert cache");
    }
    K3_ASSIGN_OR_RETURN(trace, CacheTraceWriter::Create(env, o.cache_trace_dir,
                                                        TraceHeaderFor(c, *splan, o.prepared)));
  }
  if (splan) {
    StreamingOptions sopt;
    sopt.verify_reads = o.verify_reads;
    sopt.walk_layers = layers;
    sopt.preload_experts = o.preload;
    sopt.progress = lines ? o.output.progress : ProgressMode::kNone;
    sopt.trace = trace.get();
    sopt.prefetch_experts = o.prefetch_experts;
    K3_ASSIGN_OR_RETURN(std::unique_ptr<StreamingWeights> sw,
                        StreamingWeights::Open(env, &prepared, *splan, sopt));
    streaming = sw.get();
    weights = std::move(sw);
  }
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

  // Sampling: a seed is always reported so a sampled run can be repeated.
  uint64_t seed = 0;
  if (o.sampling.sampling()) {
    seed = o.sampling.seed ? *o.sampling.seed
                           : (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
    if (!o.output.quiet) {
      LogInfo("sampler: PCG32 seed " + std::to_string(seed) + ", temperature " +
              std::to_string(o.sampling.temperature.value_or(1.0)) + ", top-p " +
              std::to_string(o.sampling.top_p.value_or(1.0)) + ", top-k " +
              std::to_string(o.sampling.top_k.value_or(0)));
    }
  }

  if (o.chat) {
    Model model(c, weights.get(), layers);
    K3_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Create(&*tokenizer, o.prepared));
    ChatOptions co;
    co.system = o.system;
    co.history_path = o.history;
    co.tmpl.thinking = !o.no_think;
    co.tmpl.effort = o.effort.value_or("max");
    co.gen = o.gen;
    co.max_positions = plan.positions;
    co.sampling = o.sampling;
    co.seed = seed;
    co.progress = lines;
    ChatIo cio;
    cio.env = env;
    cio.read_line = io.read_line ? io.read_line : ReadLineFd0;
    cio.write_stdout = out;
    cio.write_stderr = [](std::string_view s) {
      if (!Quiet()) WriteStderr(s);
    };
    return RunChatSession(&model, weights.get(), *tokenizer, tmpl, co, cio);
  }

  // 4. Outputs that can fail before the run starts.
  std::optional<Detokenizer> detok;
  if (!tokenizer) {
    K3_ASSIGN_OR_RETURN(detok, Detokenizer::Load(env, prepared));
  }
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
    if (tokenizer || detok) {
      const std::string bytes =
          tokenizer ? std::string(tokenizer->TokenBytes(s.token)) : detok->Bytes(s.token);
      text += bytes;
      const std::string ready = chunker.Push(bytes);
      if (!ready.empty()) K3_RETURN_IF_ERROR(out(ready));
    } else {
      K3_RETURN_IF_ERROR(out(std::to_string(s.token) + "\n"));
    }
    return Status::Ok();
  };
  Sampler sampler(o.sampling, seed, 0);
  K3_ASSIGN_OR_RETURN(GenerateResult result,
                      GenerateWithSampler(&model, weights.get(), g, &sampler, on_step));
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
  if (tokenizer || detok) r.generated_bytes = text;
  r.stopped_by_id = result.stopped_by_id;
  r.steps = result.steps;
  r.plan = plan;
  if (splan) {
    r.streaming_plan = *splan;
    r.streaming_stats = streaming->stats();
    r.reader_backend = std::string(streaming->reader_backend());
  }
  r.bandwidths = bandwidths;
  for (const prepared::TrunkRun& run : prepared.manifest.runs) {
    if (run.layer < layers) r.weights_used_per_pass += run.length;
  }
  if (const prepared::Region* lm = prepared.manifest.FindRegion(prepared::kLmHeadName)) {
    r.weights_used_per_pass += lm->length;
  }
  for (const prepared::ExpertRecord& rec : prepared.experts.records) {
    r.expert_record_bytes = std::max<uint64_t>(r.expert_record_bytes, rec.length);
  }
  r.peak_rss_bytes = PeakRssBytes();
  r.experts_skipped = model.experts_skipped();
  r.failures = weights->Failures();
  if (!o.out.empty()) K3_RETURN_IF_ERROR(WriteFileAtomic(env, o.out, RenderReportJson(r)));
  if (lines) LogInfo(SummaryLines(r));
  if (lines && streaming != nullptr) {
    const StreamingStats st = streaming->stats();
    LogInfo("expert cache: " + std::to_string(st.expert_requests) + " requests, " +
            std::to_string(st.expert_hits) + " resident hits, " + std::to_string(st.expert_reads) +
            " reads, " + std::to_string(st.expert_evictions) + " evictions, " +
            std::to_string(st.waves) + " waves; trunk ring loads " +
            std::to_string(st.ring_loads) + "; reader " + r.reader_backend);
  }
  if (trace) {
    const StreamingStats st = streaming->stats();
    trace->SetEngineCounters(CacheTraceCounters{st.expert_requests, st.expert_hits,
                                                st.expert_reads, st.expert_evictions});
    K3_RETURN_IF_ERROR(trace->Finish());
    if (lines) LogInfo("cache trace: " + trace->path() + " (replay: scripts/cache-replay " +
                       o.cache_trace_dir + ")");
  }

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
  app->add_option_function<std::string>(
      "--prompt", [o](const std::string& v) { o->prompt = v; },
      "prompt text (special tokens such as [BOS] are recognised)");
  app->add_option_function<std::string>(
      "--prompt-file", [o](const std::string& v) { o->prompt_file = v; },
      "read the prompt text from PATH (bytes verbatim; special tokens recognised)");
  app->add_flag("--chat", o->chat, "interactive chat on stdin (/help, /reset, /exit)");
  app->add_option_function<std::string>(
      "--system", [o](const std::string& v) { o->system = v; }, "chat: the system message");
  app->add_option("--history", o->history,
                  "chat: JSONL transcript to resume and to save after every turn");
  app->add_flag("--no-think", o->no_think, "chat: thinking channel off");
  app->add_option_function<std::string>(
      "--thinking-effort", [o](const std::string& v) { o->effort = v; },
      "chat: low|high|max (default max)");
  app->add_option_function<double>(
      "--temperature", [o](const double& v) { o->sampling.temperature = v; },
      "sample with this temperature (> 0); default greedy")
      ->check(AboveZero(1e6));
  app->add_option_function<double>(
      "--top-p", [o](const double& v) { o->sampling.top_p = v; },
      "sample from the smallest set of tokens with this probability mass, (0, 1]")
      ->check(AboveZero(1));
  app->add_option_function<int64_t>(
      "--top-k", [o](const int64_t& v) { o->sampling.top_k = v; },
      "sample from the K most likely tokens (0: all)")
      ->check(AtLeast(0));
  // Parsed here: CLI11 would wrap "-1" into 2^64 − 1 for an unsigned option.
  app->add_option_function<std::string>(
      "--seed",
      [o](const std::string& v) {
        uint64_t seed = 0;
        bool ok = !v.empty() && v.size() <= 20;
        for (char ch : v) {
          const auto d = static_cast<uint64_t>(ch - '0');
          if (ch < '0' || ch > '9' || seed > (UINT64_MAX - d) / 10) ok = false;
          if (ok) seed = seed * 10 + d;
        }
        if (!ok) {
          throw CLI::ValidationError("--seed", "\"" + v + "\" is not an integer in [0, 2^64)");
        }
        o->sampling.seed = seed;
      },
      "sampler seed (PCG32 via SplitMix64; same seed, same tokens)");
  app->add_option("--gen", o->gen, "tokens to generate (0: prefill only; chat: per turn, 2048)")
      ->check(AtLeast(0))
      ->each([o](const std::string&) { o->gen_set = true; });
  app->add_flag("--recompute", o->recompute,
                "re-run the whole prefix every step (the check path; same bits, O(T^2))");
  app->add_option("--stop-id", o->stop_ids, "stop after generating this id (repeatable)");
  app->add_option("--layers", o->layers, "run only the first N layers (NOT the model)")
      ->check(AtLeast(1));
  app->add_option("--threads", o->threads, "compute threads (never changes a bit)")
      ->check(InRange(1, kernels::kMaxThreads));
  CLI::Option* dump = app->add_option(
      "--dump-logits", o->dump_logits,
      "write the prompt's final logits (float32 little-endian, all vocab) to PATH");
  app->add_flag("--dump-logits-all", o->dump_all, "dump the logits of every step, in order")
      ->needs(dump);
  app->add_option("--out", o->out, "write the JSON report to FILE");
  app->add_option("--model-dir", o->model_dir, "where the link-mode shards live now");
  app->add_flag("--verify-reads", o->verify_reads,
                "hash every expert read against experts.idx (a mismatch: exit 4)");
  // Memory flags apply in command-line order, later flags winning (DESIGN.md §6): a total
  // (--budget-gb, --preset) replaces everything before it; --trunk-gb / --cache-gb override its
  // split.
  app->add_option_function<double>(
         "--budget-gb",
         [o](const double& v) {
           o->budget_gb = v;
           o->preset.reset();
           o->trunk_gb.reset();
           o->cache_gb.reset();
         },
         "stream weights within this TOTAL budget (GB = 10^9 bytes): trunk first, then experts")
      ->check(AboveZero(kMaxBudgetGb))
      ->trigger_on_parse();
  app->add_option_function<double>(
         "--trunk-gb", [o](const double& v) { o->trunk_gb = v; },
         "trunk budget (pinned layers + ring), overriding the split of --budget-gb/--preset")
      ->check(AboveZero(kMaxBudgetGb))
      ->trigger_on_parse();
  app->add_option_function<double>(
         "--cache-gb", [o](const double& v) { o->cache_gb = v; },
         "expert cache budget, overriding the split of --budget-gb/--preset")
      ->check(AboveZero(kMaxBudgetGb))
      ->trigger_on_parse();
  app->add_option_function<std::string>(
         "--preset",
         [o](const std::string& v) {
           o->preset = v;
           o->budget_gb.reset();
           o->trunk_gb.reset();
           o->cache_gb.reset();
         },
         "laptop|desktop|workstation|server|max|auto: a TOTAL budget (--list-presets)")
      ->trigger_on_parse();
  app->add_option("--dump-cache-trace", o->cache_trace_dir,
                  "write the expert routing trace to DIR/cache-trace.jsonl for scripts/cache-replay "
                  "(needs a memory budget)");
  app->add_flag("--preload", o->preload,
                "read every expert into the cache at start-up (needs a budget that holds them "
                "all): everything resident");
  app->add_flag("--no-floor", o->no_floor,
                "skip the start-up bandwidth probes (the report then has no floor)");
  app->add_option("--probe-seconds", o->probe_seconds,
                  "wall time of each start-up bandwidth probe (default 0.15)")
      ->check(AboveZero(60));
  app->add_option_function<std::string>(
      "--cache-policy", [o](const std::string& v) { o->cache_policy = v; },
      "expert cache eviction: lru|s3fifo (default s3fifo)");
  app->add_option("--prefetch-experts", o->prefetch_experts,
                  "read ahead this many guesses of the next MoE layer's experts per layer, when "
                  "its trunk is pinned and the cache has room (0: off; default " +
                      std::to_string(kDefaultPrefetchExperts) + "; off with --dump-cache-trace)")
      ->check(InRange(0, 4096));
  AddOutputFlags(app, &o->output);
}

int K3runMain(int argc, char** argv, const CliIo& io) {
  CLI::App app("k3run: text generation with Kimi K3 from a prepared directory", "k3run");
  RunOptions o;
  // --quiet is process state; an in-process caller (tests, a REPL host) starts each run afresh.
  SetQuiet(false);
  AddRunFlags(&app, &o);
  // Needs no PREPARED: CLI11 runs flag callbacks before it checks required positionals.
  app.add_flag_callback(
      "--list-presets",
      [&io] {
        const std::string text = ListPresetsText();
        (void)(io.write_stdout ? io.write_stdout(text) : WriteFd1(text));
        throw CLI::Success();
      },
      "print the memory presets and exit");
  return RunCli(app, argc, argv, [&] { return RunK3run(o, io); });
}

}  // namespace k3::run
