// k3run's command line: validation, the memory plan, generation, output (see cli.h).
#include "k3run/app/cli.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>

#include "common/log.h"
#include "common/sysinfo.h"
#include "formats/prepared_manifest.h"
#include "k3run/app/batch.h"
#include "k3run/app/chat_images.h"
#include "k3run/app/chat_session.h"
#include "k3run/app/cli_constraint.h"
#include "k3run/text/chat_template.h"
#include "k3run/stream/cache_trace.h"
#include "k3run/app/floor.h"
#include "k3run/app/interrupt.h"
#include "k3run/app/logits_dump.h"
#include "k3run/app/prepared_path.h"
#include "k3run/engine/generate.h"
#include "k3run/engine/image_input.h"
#include "k3run/engine/vision_encoder.h"
#include "k3run/engine/speculation.h"
#include "k3run/kernels/matmul.h"
#include "k3run/mpi/scale_out.h"
#include "k3run/engine/session.h"
#include "k3run/stream/memory_plan.h"
#include "k3run/app/report.h"
#include "k3run/engine/sampler.h"
#include "k3run/engine/stop_rules.h"
#include "k3run/stream/streaming_plan.h"
#include "k3run/stream/streaming_weights.h"
#include "k3run/text/tokenizer.h"
#include "formats/sequence_state.h"
#include "k3run/app/prefill_progress.h"
#include "k3run/text/utf8.h"
#include "k3run/weights/weights.h"

namespace k3::run {
namespace {

// Chat reserves, without --ctx, the largest of these contexts the plan allows: 32 Ki positions
// fit the released model at 8 GB (DESIGN.md §11.3); a smaller machine gets the next that fits.
constexpr int64_t kChatDefaultContext = 32768;
constexpr int64_t kChatSmallestContext = 256;
constexpr int64_t kChatDefaultGen = 2048;

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

// Reads fd 0 a line at a time (the REPL's default input).
std::optional<std::string> ReadLineFd0() {
  std::string line;
  char ch = 0;
  while (true) {
    const ssize_t n = ::read(0, &ch, 1);
    if (n < 0 && errno == EINTR) {
      if (Interrupted()) WriteStderr("\n(Ctrl-C again, /exit or Ctrl-D to leave)\n> ");
      continue;
    }
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
                            : o.no_think && o.images.empty() && !o.batch ? "--no-think"
                            : o.effort && o.images.empty() && !o.batch ? "--thinking-effort"
                            : o.hide_thinking ? "--hide-thinking"
                                       : nullptr;
    if (chat_only) return Status::Invalid(std::string(chat_only) + " needs --chat");
    if (o.no_think && o.effort) {  // --image: the prompt is a chat message (ResolveImagePrompt)
      return Status::Invalid("--no-think and --thinking-effort contradict each other: give one");
    }
  } else {
    const char* not_chat = !o.dump_logits.empty() ? "--dump-logits"
                           : !o.out.empty()       ? "--out"
                           : !o.stop_ids.empty()  ? "--stop-id"
                           : !o.stop_strings.empty() ? "--stop"
                           : o.ignore_eos         ? "--ignore-eos"
                           : o.show_special       ? "--show-special"
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
  K3_RETURN_IF_ERROR(CheckSpec(o.spec, o.sampling.sampling()));
  if (o.spec > 0 && (!o.grammar_file.empty() || !o.json_schema_file.empty() ||
                     o.tool_choice)) {
    return Status::Invalid("--spec cannot be combined with --grammar, --json-schema or "
                           "--tool-choice (verifying drafts under a grammar is not built)");
  }
  if (o.spec == 0 && (o.spec_fixed || !o.spec_oracle.empty())) {
    return Status::Invalid(std::string(o.spec_fixed ? "--spec-fixed" : "--spec-oracle") +
                           " needs --spec N");
  }
  if (o.spec > 0 && o.recompute) {
    return Status::Invalid("--spec and --recompute are exclusive: --recompute re-runs the whole "
                           "prefix every step, there is nothing to draft against");
  }
  return ValidateSamplerOptions(o.sampling);
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

namespace {

// What a run feeds, before the prepared directory is open: ids from --ids, or text to encode.
struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;
  // --image: the images (preprocessed), the tower that encodes them, what encoding cost.
  std::vector<ImageInput> images;
  std::unique_ptr<VisionEncoder> vision;
  std::string no_vision;  // --chat without a tower: what /image says
  ImageStats image_stats;
  std::vector<MediaSpan> spans;  // encoded after the plan, before the text weights load
  int64_t largest_image_tokens() const {
    int64_t n = 0;
    for (const ImageInput& i : images) n = std::max(n, i.tokens());
    return n;
  }
  int64_t image_tokens() const {
    int64_t n = 0;
    for (const ImageInput& i : images) n += i.tokens();
    return n;
  }
};

// --image, after the plan and before the text weights load: the tower runs alone (its weights,
// scratch and rows must fit the budget, or MemAvailable without one), then gives its weights
// back; the plan holds only the rows beside the text model (docs/VISION.md "Memory").
Status EncodePromptImages(Engine* engine, PromptInput* in) {
  if (in->images.empty()) return Status::Ok();
  const uint64_t peak =
      in->vision->PlanBytes(in->largest_image_tokens()) +
      VisionEncoder::RowBytes(in->vision->dims(),
                              in->image_tokens() - in->largest_image_tokens());
  const uint64_t limit =
      engine->memory_plan().budget > 0 ? engine->memory_plan().budget : engine->mem_available();
  if (peak > limit) {
    return Status::Invalid("--image: the vision tower needs " + FormatGb(peak) +
                           " (its weights, its working memory for the largest image and the "
                           "rows), more than the " + FormatGb(limit) +
                           (engine->memory_plan().budget > 0 ? " budget" : " MemAvailable") +
                           "; give a larger budget or smaller images");
  }
  K3_ASSIGN_OR_RETURN(
      in->spans,
      EncodeImages(in->vision.get(), in->ids, 0,
                   static_cast<int32_t>(engine->config().media_placeholder_token_id), in->images,
                   &in->image_stats));
  in->vision->Release();
  return Status::Ok();
}

// --image with --prompt / --prompt-file: the prompt becomes one user message (the images, then
// the text) rendered by the chat template with the generation prompt, so the model answers
// about the images (docs/VISION.md "CLI"). Each image is read and checked before any pass.
Status ResolveImagePrompt(const Engine& engine, const RunOptions& o, PromptInput* in) {
  if (o.chat) {
    return Status::Invalid("--image is for --prompt and --prompt-file; in --chat, attach an "
                           "image to your next message with /image FILE");
  }
  if (!o.ids.empty()) {
    return Status::Invalid("--image needs --prompt or --prompt-file (the ids of --ids cannot "
                           "say where an image goes)");
  }
  if (!o.load_state.empty()) {
    return Status::Invalid("--image cannot be combined with --load-state: the state file does "
                           "not carry image rows");
  }
  K3_ASSIGN_OR_RETURN(in->vision, VisionEncoder::Open(Env::Default(), engine.prepared()));
  for (const std::string& path : o.images) {
    K3_ASSIGN_OR_RETURN(ImageInput image, LoadImageFile(Env::Default(), path));
    if (o.ctx && image.tokens() >= *o.ctx) {
      return Status::Invalid("--image " + path + ": the image needs " +
                             std::to_string(image.tokens()) + " tokens (" +
                             std::to_string(image.patches.grid.grid_w) + "x" +
                             std::to_string(image.patches.grid.grid_h) + " patches / 4), more "
                             "than --ctx " + std::to_string(*o.ctx) + " holds; raise --ctx or "
                             "use a smaller image");
    }
    in->images.push_back(std::move(image));
  }
  K3_ASSIGN_OR_RETURN(const ChatTemplate chat,
                      ChatTemplate::Create(engine.tokenizer(), engine.prepared().dir));
  ChatMessage user;
  user.role = "user";
  user.content = in->text;
  for (const ImageInput& image : in->images) user.images.push_back(ChatImageOf(image, 0));
  TemplateOptions t;
  t.thinking = !o.no_think;
  if (o.effort) t.effort = *o.effort;
  K3_RETURN_IF_ERROR(ValidateEffort(t.effort));
  K3_ASSIGN_OR_RETURN(in->ids, chat.RenderChecked({user}, t, /*generation_prompt=*/true));
  const auto P = static_cast<int64_t>(in->ids.size());
  if (o.ctx && P + o.gen > *o.ctx) {
    std::string which;
    for (const ImageInput& image : in->images) {
      which += (which.empty() ? "" : ", ") + image.name + " (" + std::to_string(image.tokens()) +
               " image tokens)";
    }
    return Status::Invalid("--ctx " + std::to_string(*o.ctx) + ": the prompt with --image " +
                           which + " is " + std::to_string(P) + " ids, + --gen " +
                           std::to_string(o.gen) + " needs " + std::to_string(P + o.gen) +
                           " positions; raise --ctx or use smaller images");
  }
  return Status::Ok();
}

// --chat: the tower when the directory has one (the plan counts it whether or not the chat sees
// an image, docs/VISION.md "CLI and chat"); else the reason /image gives.
Status OpenChatVision(const Engine& engine, PromptInput* in) {
  Result<std::unique_ptr<VisionEncoder>> v = VisionEncoder::Open(Env::Default(), engine.prepared());
  if (!engine.prepared().manifest.vision) {
    in->no_vision = v.status().message();
    return Status::Ok();
  }
  K3_ASSIGN_OR_RETURN(in->vision, std::move(v));
  return Status::Ok();
}

// Phase 1: everything that needs no weights.
Result<kernels::Isa> SetUpKernels(const RunOptions& o) {
  K3_ASSIGN_OR_RETURN(kernels::Isa isa, kernels::IsaFromEnvironment());
  kernels::SetIsa(isa);
  if (o.threads > 0) kernels::SetThreads(o.threads);
  return isa;
}

// The most prompt text read from a file or stdin.
constexpr uint64_t kMaxPromptBytes = uint64_t{1} << 30;

// `--prompt-file -` and `--prompt-file /dev/stdin` read standard input (a pipe is no regular
// file, which Env refuses to read).
bool IsStdinPath(const std::string& path) {
  return path == "-" || path == "/dev/stdin" || path == "/dev/fd/0" || path == "/proc/self/fd/0";
}

Result<std::string> ReadAllFd0() {
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(0, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoErrno("read", "standard input", errno);
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxPromptBytes) {
      return Status::Invalid("standard input is longer than " + std::to_string(kMaxPromptBytes) +
                             " bytes");
    }
  }
}

Result<PromptInput> ReadPromptInput(Env* env, const CliIo& io, const RunOptions& o) {
  K3_RETURN_IF_ERROR(CheckModes(o));
  PromptInput in;
  if (!o.ids.empty()) {
    K3_ASSIGN_OR_RETURN(in.ids, ParseIdList(o.ids, "--ids"));
  }
  if (o.prompt) in.text = *o.prompt;
  if (o.prompt_file) {
    Result<std::string> text = IsStdinPath(*o.prompt_file)
                                   ? (io.read_stdin ? io.read_stdin() : ReadAllFd0())
                                   : ReadFileToString(env, *o.prompt_file, kMaxPromptBytes);
    // An unreadable input is a usage error (exit 2, DESIGN.md §6), whatever errno said.
    if (!text.ok()) return Status::Invalid("--prompt-file: " + text.status().message());
    in.text = std::move(text).value();
  }
  if (o.gen < 0) return Status::Invalid("--gen " + std::to_string(o.gen) + ": must be >= 0");
  return in;
}

const char* ModeFlag(const RunOptions& o) {
  return o.chat ? "--chat" : o.prompt ? "--prompt" : o.prompt_file ? "--prompt-file" : "--ids";
}

// Phase 2: the prompt's ids and the run's limits against the prepared directory. Returns the
// positions a pass plans for: the prompt, or in chat the longest transcript a turn may render.
Result<int64_t> ResolvePrompt(const Engine& engine, const RunOptions& o, PromptInput* in) {
  const ModelConfig& c = engine.config();
  const std::string manifest = JoinPath(o.prepared, "k3.json");
  const char* mode = ModeFlag(o);
  if (o.ids.empty() && engine.tokenizer() == nullptr) {
    return Status::Invalid(std::string(mode) + " needs a tokenizer, and " + o.prepared +
                           " has no tokenizer/tiktoken.model and tokenizer_config.json: pack "
                           "a checkpoint that has them, or give --ids");
  }
  if (!o.images.empty()) {
    K3_RETURN_IF_ERROR(ResolveImagePrompt(engine, o, in));
  } else if (!o.chat && o.ids.empty()) {
    // Prompts from the user's own text may name special tokens (the upstream default).
    in->ids = engine.tokenizer()->Encode(in->text, /*allow_special=*/true);
    if (in->ids.empty()) {
      return Status::Invalid(std::string(mode) + ": the prompt is empty (0 ids); give some text");
    }
  }
  K3_RETURN_IF_ERROR(CheckIdsInVocab(std::vector<int64_t>(in->ids.begin(), in->ids.end()),
                                     c.vocab, mode, manifest));
  K3_RETURN_IF_ERROR(CheckIdsInVocab(o.stop_ids, c.vocab, "--stop-id", manifest));
  if (o.ctx && o.gen >= *o.ctx) {
    return Status::Invalid("--gen " + std::to_string(o.gen) + " with --ctx " +
                           std::to_string(*o.ctx) + ": --gen must be below the context");
  }
  const int64_t P = o.chat ? 0 : static_cast<int64_t>(in->ids.size());
  if (P > kMaxPositions || o.gen > kMaxPositions - P) {
    return Status::Invalid("--gen " + std::to_string(o.gen) + " with a prompt of " +
                           std::to_string(P) + " ids needs " + std::to_string(P + o.gen) +
                           " positions; the limit is " + std::to_string(kMaxPositions) +
                           " (max_position_embeddings): lower --gen or shorten " + mode);
  }
  return P;
}

// The positions a prompt run needs: what a loaded state holds, the prompt, and every generated
// token fed back; --ctx may reserve more, never less.
Result<int64_t> PromptContext(const RunOptions& o, int64_t held, int64_t P) {
  const int64_t need = held + PositionsNeeded(P, o.gen);
  if (!o.ctx) return need;
  if (*o.ctx < need) {
    return Status::Invalid("--ctx " + std::to_string(*o.ctx) + ": " +
                           (held > 0 ? std::to_string(held) + " positions of --load-state + "
                                     : std::string()) +
                           "the prompt (" + std::to_string(P) + " ids) + --gen " +
                           std::to_string(o.gen) + " need " + std::to_string(need) +
                           " positions; raise --ctx or lower --gen");
  }
  return *o.ctx;
}

PlanOptions PlanOptionsFor(const RunOptions& o, const CliIo& io, bool lines) {
  PlanOptions po;
  po.layers = o.layers;
  po.chunk = o.chunk;
  po.budget.budget_gb = o.budget_gb;
  po.budget.trunk_gb = o.trunk_gb;
  po.budget.cache_gb = o.cache_gb;
  po.budget.preset = o.preset;
  po.preload = o.preload;
  po.verify_reads = o.verify_reads;
  po.prefetch_experts = o.prefetch_experts;
  po.spec_rows = o.spec;
  po.progress = lines ? o.output.progress : ProgressMode::kNone;
  po.mem_available = io.mem_available;
  if (o.serve.serve) po.sequences = o.max_seqs.value_or(0);  // 0: as many as the plan fits
  return po;
}

// Phase 3: the memory plan, before anything large is allocated. `held`: positions a loaded
// state brings. Chat without --ctx takes the largest default context the plan allows.
Status PlanRun(Engine* engine, const RunOptions& o, const CliIo& io, int64_t P, int64_t held,
               bool lines, uint64_t vision_bytes = 0, const VisionEncoder* chat_vision = nullptr) {
  PlanOptions po = PlanOptionsFor(o, io, lines);
  po.vision_bytes = vision_bytes;
  if (o.cache_policy) {
    K3_ASSIGN_OR_RETURN(po.budget.policy, ParseCachePolicy(*o.cache_policy));
    if (!po.budget.any()) {
      return Status::Invalid("--cache-policy needs a memory budget (--budget-gb, --preset, "
                             "--trunk-gb or --cache-gb); without one every expert is held");
    }
  }
  if (!o.chat) {
    K3_ASSIGN_OR_RETURN(po.positions, PromptContext(o, held, P));
    po.pass_rows = o.recompute ? po.positions : std::max<int64_t>({P, o.spec + 1, 1});
    return engine->Plan(po);
  }
  if (o.ctx) {
    po.positions = *o.ctx;
    po.pass_rows = *o.ctx;
    if (chat_vision) po.vision_bytes = ChatVisionBytes(*chat_vision, *o.ctx);
    return engine->Plan(po);
  }
  Status last;
  for (int64_t ctx = kChatDefaultContext; ctx >= kChatSmallestContext && ctx > o.gen; ctx /= 2) {
    po.positions = ctx;
    po.pass_rows = ctx;
    if (chat_vision) po.vision_bytes = ChatVisionBytes(*chat_vision, ctx);
    last = engine->Plan(po);
    if (last.ok()) return last;
  }
  if (last.ok()) {
    return Status::Invalid("--gen " + std::to_string(o.gen) + ": chat needs a context above it; "
                           "give --ctx (more than --gen) or lower --gen");
  }
  return last;
}

// The bandwidth probes run before the weights are allocated: their buffers never raise the
// peak RSS above the plan. A failed probe only costs the report its floor.
std::optional<Bandwidths> ProbeFloor(Env* env, const Engine& engine, const RunOptions& o,
                                     bool lines) {
  if (o.no_floor) return std::nullopt;
  const int topk = engine.config().topk;
  ProbeOptions po;
  po.seconds_per_probe = o.probe_seconds;
  po.max_buffer_bytes = engine.memory_plan().total();
  if (const std::optional<StreamingPlan>& sp = engine.streaming_plan()) {
    po.expert_queue_depth = std::max(1, std::min(topk, sp->expert_slots - 1));
    po.trunk_request_bytes = sp->ring_slot_bytes;
  } else {
    po.expert_queue_depth = std::max(1, topk);
  }
  Result<Bandwidths> b = ProbeBandwidths(env, engine.prepared(), po);
  if (b.ok()) return *b;
  if (lines) {
    LogWarn("bandwidth probe failed (the report will have no floor): " + b.status().ToString());
  }
  return std::nullopt;
}

Result<std::unique_ptr<CacheTraceWriter>> OpenTrace(Env* env, const Engine& engine,
                                                    const RunOptions& o) {
  if (o.cache_trace_dir.empty()) return std::unique_ptr<CacheTraceWriter>();
  if (o.chat) {
    return Status::Invalid("--dump-cache-trace is not supported with --chat: trace a prompt "
                           "(--prompt, --prompt-file or --ids) instead");
  }
  if (!engine.streaming_plan()) {
    return Status::Invalid("--dump-cache-trace needs a memory budget (--budget-gb, --preset, "
                           "--trunk-gb or --cache-gb): without one there is no expert cache");
  }
  return CacheTraceWriter::Create(env, o.cache_trace_dir,
                                  TraceHeaderFor(engine.config(), *engine.streaming_plan(),
                                                 o.prepared));
}

void LogPlan(const Engine& engine, kernels::Isa isa, bool chat) {
  const MemoryPlan& plan = engine.memory_plan();
  const ModelConfig& c = engine.config();
  LogInfo("plan: " + plan.Describe() + "; MemAvailable " + FormatGb(engine.mem_available()) +
          "; ISA " + kernels::IsaName(isa) + ", threads " + std::to_string(kernels::Threads()));
  if (chat) {  // the context a chat chose for itself (a prompt run's is what it needs)
    LogInfo("context: " + std::to_string(plan.positions) + " positions (--ctx), passes of up to " +
            std::to_string(plan.chunk) + " rows (--chunk)");
  }
  if (engine.layers() != c.n_layers) {
    LogWarn("--layers " + std::to_string(engine.layers()) + ": running the first " +
            std::to_string(engine.layers()) + " of " + std::to_string(c.n_layers) +
            " layers: this is NOT the model");
  }
}

// Sampling: a seed is always reported so a sampled run can be repeated; options that have no
// effect as combined are named.
uint64_t ChooseSeed(const RunOptions& o) {
  for (const std::string& w : SamplerWarnings(o.sampling)) LogWarn(w);
  if (!o.sampling.sampling()) return 0;
  const uint64_t seed = o.sampling.seed ? *o.sampling.seed
                                        : (uint64_t{std::random_device{}()} << 32) |
                                              std::random_device{}();
  if (!o.output.quiet) {
    const SamplerOptions& so = o.sampling;
    char line[256];
    std::snprintf(line, sizeof line,
                  "sampler: PCG32 seed %llu, temperature %g, top-k %lld, top-p %g, min-p %g, "
                  "repeat-penalty %g, presence %g, frequency %g over the last %lld ids",
                  static_cast<unsigned long long>(seed), so.effective_temperature(),
                  static_cast<long long>(so.top_k.value_or(0)), so.top_p.value_or(1.0),
                  so.min_p.value_or(0.0), so.repeat_penalty, so.presence_penalty,
                  so.frequency_penalty, static_cast<long long>(so.repeat_last_n));
    LogInfo(line);
  }
  return seed;
}

Status RunChat(Engine* engine, const RunOptions& o, const CliIo& io, Env* env, uint64_t seed,
               bool lines, const std::function<Status(std::string_view)>& out,
               const CliConstraint& constraint, PromptInput* input) {
  K3_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Create(engine->tokenizer(), o.prepared));
  ChatOptions co;
  co.system = o.system;
  co.history_path = o.history;
  co.tmpl = constraint.tmpl;
  co.tmpl.thinking = !o.no_think;
  co.tmpl.effort = o.effort.value_or("max");
  co.tools = constraint.tools;
  if (constraint.library != nullptr) co.make_constraint = [&constraint] { return constraint.Make(); };
  co.gen = o.gen;
  if (!o.history.empty()) co.state_path = o.history + ".state";
  co.sampling = o.sampling;
  co.seed = seed;
  co.spec = o.spec;
  co.progress = lines;
  co.hide_thinking = o.hide_thinking;
  co.terminal = !io.write_stdout && ::isatty(1) == 1;
  co.vision = input->vision.get();
  co.no_vision = input->no_vision;
  ChatIo cio;
  cio.env = env;
  cio.read_line = io.read_line ? io.read_line : ReadLineFd0;
  cio.write_stdout = out;
  cio.write_stderr = [](std::string_view s) {
    if (!Quiet()) WriteStderr(s);
  };
  return RunChatSession(engine, tmpl, co, cio);
}

// What a prompt run produced, for the report.
struct PromptRun {
  GenerateResult result;
  std::optional<GrammarConstraint::Timing> constraint;  // --grammar / --json-schema
  std::optional<std::string> text;  // the generated bytes; nullopt without a tokenizer
  std::string stop_reason = "gen";  // gen | end-token | stop-id | stop-string
};

// What of the generated bytes reaches stdout (k3run/engine/stop_rules.h): special tokens only
// with --show-special, never a stop string or a split UTF-8 sequence, and a final newline on a
// terminal so the shell prompt starts on its own line.
class ShownText {
 public:
  ShownText(const tok::Tokenizer* tokenizer, const RunOptions& o, bool terminal,
            std::function<Status(std::string_view)> out)
      : tokenizer_(tokenizer), show_special_(o.show_special), terminal_(terminal),
        stops_(o.stop_strings), out_(std::move(out)) {}

  Status Token(int32_t id) {
    if (!tokenizer_) return out_(std::to_string(id) + "\n");
    if (!show_special_ && tok::IsAddedToken(*tokenizer_, id)) return Status::Ok();
    return Write(chunker_.Push(stops_.Push(tokenizer_->TokenBytes(id))));
  }
  bool stopped() const { return stops_.stopped(); }
  Status Finish() {
    K3_RETURN_IF_ERROR(Write(chunker_.Push(stops_.Flush()) + chunker_.Flush()));
    if (terminal_ && tokenizer_ && !ends_with_newline_) return out_("\n");
    return Status::Ok();
  }

 private:
  Status Write(const std::string& bytes) {
    if (bytes.empty()) return Status::Ok();
    ends_with_newline_ = bytes.back() == '\n';
    return out_(bytes);
  }

  const tok::Tokenizer* tokenizer_;
  bool show_special_;
  bool terminal_;
  StopText stops_;
  Utf8Chunker chunker_;
  std::function<Status(std::string_view)> out_;
  bool ends_with_newline_ = true;  // nothing written: no newline needed
};

// The stop ids of a prompt run: --stop-id, and the model's end tokens unless --ignore-eos.
std::vector<int64_t> StopIds(const Engine& engine, const RunOptions& o) {
  std::vector<int64_t> ids = o.stop_ids;
  if (!o.ignore_eos) {
    for (int64_t id : EndTokenIds(engine.tokenizer())) ids.push_back(id);
  }
  return ids;
}

std::string StopReason(const RunOptions& o, const PromptRun& run, bool stopped_by_text) {
  if (stopped_by_text) return "stop-string";
  if (!run.result.stopped_by_id) return "gen";
  const int64_t last = run.result.generated.back();
  const bool asked = std::find(o.stop_ids.begin(), o.stop_ids.end(), last) != o.stop_ids.end();
  return asked ? "stop-id" : "end-token";
}

// Phase 4: generate, streaming the bytes to stdout as they are decided.
Result<PromptRun> Generate(Engine* engine, Env* env, const RunOptions& o, PromptInput* input,
                           uint64_t seed, bool terminal,
                           const std::function<Status(std::string_view)>& out,
                           const CliConstraint& constraint) {
  const std::vector<int32_t>& prompt = input->ids;
  const tok::Tokenizer* tokenizer = engine->tokenizer();
  const int64_t vocab = engine->config().vocab;
  std::unique_ptr<LogitsDump> dump;
  if (!o.dump_logits.empty()) {
    K3_ASSIGN_OR_RETURN(dump, LogitsDump::Open(env, o.dump_logits));
  }
  GenerateOptions g;
  g.prompt = prompt;
  g.gen = o.gen;
  g.recompute = o.recompute;
  g.spec = o.spec;
  g.spec_fixed = o.spec_fixed;
  if (!o.spec_oracle.empty()) {
    // Drafts from the ids a plain run generated (benchmarks on synthetic weights, whose text
    // never repeats): the output is the same whatever is drafted; only the passes differ.
    K3_ASSIGN_OR_RETURN(std::vector<int32_t> truth, ParseIdList(o.spec_oracle, "--spec-oracle"));
    for (int32_t id : truth) {
      if (id >= vocab) {
        return Status::Invalid("--spec-oracle: id " + std::to_string(id) + " is not below the "
                               "vocabulary size " + std::to_string(vocab));
      }
    }
    g.drafter = ContinuationDrafter(std::move(truth));
  }
  g.stop_ids = StopIds(*engine, o);
  ShownText shown(tokenizer, o, terminal, out);
  g.stop_requested = [&shown] { return shown.stopped() || Interrupted(); };
  PromptRun run;
  if (tokenizer) run.text.emplace();
  const bool step_lines = o.verbose && !o.output.quiet;
  auto on_step = [&](const StepRecord& s, const float* logits) -> Status {
    if (step_lines) LogInfo(StepLine(s));
    if (dump && (o.dump_all || s.index == 0)) K3_RETURN_IF_ERROR(dump->Append(logits, vocab));
    if (s.token < 0) return Status::Ok();
    if (tokenizer) *run.text += tokenizer->TokenBytes(s.token);
    return shown.Token(s.token);
  };
  std::unique_ptr<Sequence> seq = engine->NewSequence(o.sampling, seed, 0);
  if (!o.load_state.empty()) K3_RETURN_IF_ERROR(engine->LoadSequence(o.load_state, seq.get()));
  if (!input->spans.empty()) K3_RETURN_IF_ERROR(engine->AttachMedia(seq.get(), input->spans));
  K3_ASSIGN_OR_RETURN(seq->constraint(), constraint.Make());
  K3_ASSIGN_OR_RETURN(run.result, run::Generate(engine, seq.get(), g, on_step));
  if (const auto* c = dynamic_cast<const GrammarConstraint*>(seq->constraint().get())) {
    run.constraint = c->timing();
  }
  if (!o.save_state.empty()) K3_RETURN_IF_ERROR(engine->SaveSequence(*seq, o.save_state));
  K3_RETURN_IF_ERROR(shown.Finish());
  run.stop_reason = StopReason(o, run, shown.stopped());
  if (Interrupted() && run.stop_reason == "gen" &&
      static_cast<int64_t>(run.result.generated.size()) < o.gen) {
    run.stop_reason = "interrupted";
    LogWarn("interrupted (Ctrl-C): stopped after " +
            std::to_string(run.result.generated.size()) + " tokens");
  }
  if (dump) K3_RETURN_IF_ERROR(dump->Finish());
  return run;
}

RunReport BuildReport(const Engine& engine, const RunOptions& o, kernels::Isa isa,
                      const std::vector<int32_t>& prompt, const PromptRun& run,
                      const std::optional<Bandwidths>& bandwidths) {
  const prepared::PreparedDir& prepared = engine.prepared();
  RunReport r;
  r.prepared = o.prepared;
  r.layers_run = engine.layers();
  r.n_layers = engine.config().n_layers;
  r.recompute = o.recompute;
  r.isa = kernels::IsaName(isa);
  r.threads = kernels::Threads();
  r.prompt_ids = prompt;
  r.generated_ids = run.result.generated;
  r.constraint = run.constraint;
  r.generated_bytes = run.text;
  r.stopped_by_id = run.result.stopped_by_id;
  r.stop_reason = run.stop_reason;
  r.steps = run.result.steps;
  r.spec = o.spec;
  r.spec_stats = run.result.spec;
  r.plan = engine.memory_plan();
  if (const StreamingWeights* sw = engine.streaming()) {
    r.streaming_plan = *engine.streaming_plan();
    r.streaming_stats = sw->stats();
    r.reader_backend = std::string(sw->reader_backend());
  }
  r.bandwidths = bandwidths;
  const PassWeights pass = PassWeightBytes(prepared, engine.layers());
  r.weights_used_per_pass = pass.weights_used;
  r.expert_record_bytes = pass.expert_record;
  r.peak_rss_bytes = PeakRssBytes();
  r.experts_skipped = engine.experts_skipped();
  r.failures = engine.Failures();
  return r;
}

// Phase 5: the report, the cache statistics and trace, and the RUN INVALID verdict (exit 4).
Status Report(Env* env, const Engine& engine, const RunOptions& o, const RunReport& r,
              CacheTraceWriter* trace, bool lines) {
  if (!o.out.empty()) K3_RETURN_IF_ERROR(WriteFileAtomic(env, o.out, RenderReportJson(r)));
  if (lines) LogInfo(o.verbose ? SummaryLines(r) : SummaryLine(r));
  const StreamingWeights* streaming = engine.streaming();
  if (lines && o.verbose && streaming != nullptr) {
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
  if (r.experts_skipped == 0 && r.failures.empty()) return Status::Ok();
  std::string msg = "RUN INVALID: " + std::to_string(r.failures.size()) +
                    " expert(s) could not be used (" + std::to_string(r.experts_skipped) +
                    " token-expert pairs skipped); the generated ids are not trustworthy:";
  for (const ExpertFailure& f : r.failures) {
    msg += "\n  layer " + std::to_string(f.layer) + " expert " + std::to_string(f.expert) +
           ": " + f.reason;
  }
  return Status::Unreliable(msg);
}

// The positions a --load-state file holds (its header only: the plan comes before any large
// read). Also refuses what cannot combine with it.
Result<int64_t> HeldByState(Env* env, const Engine& engine, const RunOptions& o) {
  if (o.load_state.empty()) return int64_t{0};
  if (o.chat) {
    return Status::Invalid("--load-state is for --prompt, --prompt-file and --ids; a chat keeps "
                           "its state beside --history (HISTORY.state)");
  }
  if (o.recompute) {
    return Status::Invalid("--load-state with --recompute: the check path re-runs the whole "
                           "sequence from its start, which a state file does not hold");
  }
  K3_ASSIGN_OR_RETURN(seqstate::StateHeader h,
                      seqstate::ReadSequenceStateHeader(env, o.load_state,
                                                        engine.prepared().manifest_hash));
  return static_cast<int64_t>(h.n_tokens);
}

ProgressMode ResolvedProgressMode(ProgressMode m) {
  if (m != ProgressMode::kAuto) return m;
  return isatty(2) ? ProgressMode::kBar : ProgressMode::kPlain;
}

// --batch (k3run/app/batch.h): the requests read and checked, the plan for every sequence's
// positions, the weights, then the scheduler.
// Right after Engine::Open on rank 0 (or in a run without --mpi): the scale-out handshake and
// the remote experts, or the refusal of a share directory outside the run it was made for.
Status AttachScaleOut(ScaleOut* scale_out, Engine* engine, const RunOptions& o) {
  if (scale_out == nullptr) return CheckNotShare(engine->prepared());
  return scale_out->AttachRoot(engine, o.prepared);
}

Status RunBatchMode(const RunOptions& o, const CliIo& io, Env* env, kernels::Isa isa,
                    const std::function<Status(std::string_view)>& out, bool lines,
                    ScaleOut* scale_out) {
  K3_RETURN_IF_ERROR(CheckBatchFlags(o));
  Result<std::string> text = IsStdinPath(*o.batch)
                                 ? (io.read_stdin ? io.read_stdin() : ReadAllFd0())
                                 : ReadFileToString(env, *o.batch, kMaxPromptBytes);
  if (!text.ok()) return Status::Invalid("--batch: " + text.status().message());
  K3_RETURN_IF_ERROR(CheckPreparedPath(env, o.prepared));
  Result<std::unique_ptr<Engine>> opened = Engine::Open(env, o.prepared, o.model_dir);
  if (!opened.ok()) return ExplainOpenFailure(env, o.prepared, opened.status());
  std::unique_ptr<Engine> engine = std::move(opened).value();
  K3_RETURN_IF_ERROR(AttachScaleOut(scale_out, engine.get(), o));
  const ModelConfig& c = engine->config();
  K3_ASSIGN_OR_RETURN(std::vector<BatchInput> inputs,
                      ParseBatchInputs(*text, BatchInputName(*o.batch), engine->tokenizer(),
                                       c.vocab, o.gen));
  std::unique_ptr<VisionEncoder> vision;  // lines with "images"
  K3_RETURN_IF_ERROR(ResolveBatchImages(*engine, o, &inputs, &vision));
  K3_RETURN_IF_ERROR(CheckBatchInputs(o, inputs));
  K3_RETURN_IF_ERROR(
      CheckIdsInVocab(o.stop_ids, c.vocab, "--stop-id", JoinPath(o.prepared, "k3.json")));
  K3_ASSIGN_OR_RETURN(const CliConstraint constraint,
                      LoadCliConstraint(env, engine->tokenizer(), o));
  PlanOptions po = PlanOptionsFor(o, io, lines);
  if (o.cache_policy) {
    K3_ASSIGN_OR_RETURN(po.budget.policy, ParseCachePolicy(*o.cache_policy));
    if (!po.budget.any()) return Status::Invalid("--cache-policy needs a memory budget");
  }
  K3_ASSIGN_OR_RETURN(po.positions, BatchPositions(o, inputs));
  if (vision) {  // the tower for the largest image (rows of the other admitted lines: not)
    int64_t largest = 0;
    for (const BatchInput& in : inputs) {
      for (const ImageInput& i : in.image_inputs) largest = std::max(largest, i.tokens());
    }
    po.vision_bytes = vision->PlanBytes(largest);
  }
  // Never more sequences than inputs; without --max-seqs the plan chooses (0).
  const auto n = static_cast<int64_t>(inputs.size());
  po.sequences = o.max_seqs ? std::min(*o.max_seqs, n) : 0;
  // Room for every sequence's prompt in one pass (so they start decoding together and share
  // every decode pass after it), within what the plan allows (the chunk, at most 512 rows).
  const int64_t together = std::min(o.max_seqs.value_or(kDefaultMaxSeqs), n);
  int64_t longest = 1;
  for (const BatchInput& in : inputs) {
    longest = std::max(longest, static_cast<int64_t>(in.ids.size()));
  }
  po.pass_rows = together * std::max<int64_t>(longest, o.spec + 1);  // drafts: spec + 1 rows
  K3_RETURN_IF_ERROR(engine->Plan(po));
  // As many as fit is more than the inputs need: plan again for exactly them, so the room the
  // other sequences' caches and states would take goes back to the weights and the chunk.
  if (po.sequences == 0 && engine->memory_plan().sequences > n) {
    po.sequences = n;
    K3_RETURN_IF_ERROR(engine->Plan(po));
  }
  if (lines && engine->streaming_plan()) LogInfo(engine->streaming_plan()->Describe());
  BatchContext ctx;
  ctx.bandwidths = ProbeFloor(env, *engine, o, lines);  // before the weights take the memory
  ctx.pass_weights = PassWeightBytes(engine->prepared(), engine->layers());
  K3_RETURN_IF_ERROR(engine->LoadWeights());
  if (lines) LogPlan(*engine, isa, false);
  ctx.env = env;
  ctx.out = out;
  ctx.lines = lines;
  ctx.seed = ChooseSeed(o);
  ctx.isa = kernels::IsaName(isa);
  if (constraint.library != nullptr) ctx.make_constraint = [&constraint] { return constraint.Make(); };
  ctx.vision = vision.get();
  return RunBatch(engine.get(), o, inputs, ctx);
}

// --serve: plan as a chat does (the largest default context that fits, or --ctx) for
// --max-seqs sequences; the server loads the weights behind /health (k3run/serve/server.h).
Status Serve(const RunOptions& o, const CliIo& io, Env* env, kernels::Isa isa, bool lines,
             ScaleOut* scale_out) {
  const char* other = !o.ids.empty() || o.prompt || o.prompt_file ? "a prompt (--ids, --prompt, "
                                                                    "--prompt-file)"
                      : o.chat                   ? "--chat"
                      : o.batch                  ? "--batch"
                      : !o.out.empty()           ? "--out"
                      : !o.dump_logits.empty()   ? "--dump-logits"
                      : !o.save_state.empty() || !o.load_state.empty() ? "--save-state/--load-state"
                      : !o.cache_trace_dir.empty() ? "--dump-cache-trace"
                      : o.recompute                ? "--recompute"
                      : !o.spec_oracle.empty()     ? "--spec-oracle (a prompt run's)"
                      : AnyConstraintFlag(o)
                          ? "--grammar/--json-schema/--tools (requests bring tools, "
                            "tool_choice and response_format)"
                                                   : nullptr;
  if (other) {
    return Status::Invalid(std::string("--serve cannot be used with ") + other +
                           ": requests bring their prompts and options (docs/SERVER.md)");
  }
  // Requests that sample or bring tools/response_format decode without drafts (scheduler.h).
  K3_RETURN_IF_ERROR(CheckSpec(o.spec, /*sampling=*/false));
  if (o.spec == 0 && o.spec_fixed) return Status::Invalid("--spec-fixed needs --spec N");
  K3_RETURN_IF_ERROR(CheckPreparedPath(env, o.prepared));
  Result<std::unique_ptr<Engine>> opened = Engine::Open(env, o.prepared, o.model_dir);
  if (!opened.ok()) return ExplainOpenFailure(env, o.prepared, opened.status());
  std::unique_ptr<Engine> engine = std::move(opened).value();
  K3_RETURN_IF_ERROR(AttachScaleOut(scale_out, engine.get(), o));
  RunOptions as_chat = o;  // the chat's context rule, with room for at least one token
  as_chat.chat = true;
  as_chat.gen = 1;
  // Images (docs/SERVER.md "Images"): the tower is opened once; the plan holds its weights and
  // its scratch and rows for --max-image-tokens. A text-only directory serves text.
  std::unique_ptr<VisionEncoder> vision;
  std::string no_vision;
  if (Result<std::unique_ptr<VisionEncoder>> v = VisionEncoder::Open(env, engine->prepared());
      v.ok()) {
    vision = std::move(v).value();
  } else {
    no_vision = v.status().message();
  }
  K3_RETURN_IF_ERROR(PlanRun(engine.get(), as_chat, io, 0, 0, lines,
                             vision ? vision->PlanBytes(o.serve.max_image_tokens) : 0));
  if (lines && engine->streaming_plan()) LogInfo(engine->streaming_plan()->Describe());
  if (lines) LogPlan(*engine, isa, /*chat=*/true);
  std::string name = o.prepared;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') == std::string::npos ? 0 : name.find_last_of('/') + 1);
  ServeOptions serve = o.serve;
  serve.spec = o.spec;
  serve.spec_fixed = o.spec_fixed;
  return RunServer(engine.get(), serve, name, engine->memory_plan().sequences, vision.get(),
                   no_vision);
}

}  // namespace

// parse → open the engine → plan → probes → weights → run the prompt or chat → report.
Status RunK3run(const RunOptions& options, const CliIo& io) {
  RunOptions o = options;
  if (o.chat && !o.gen_set) o.gen = kChatDefaultGen;
  Env* env = io.env ? io.env : Env::Default();
  const auto out = io.write_stdout ? io.write_stdout : WriteFd1;
  const bool lines = !o.output.quiet && o.output.progress != ProgressMode::kNone;

  K3_ASSIGN_OR_RETURN(kernels::Isa isa, SetUpKernels(o));
  // --mpi: ranks ≥ 1 serve experts for rank 0 and print nothing on stdout; rank 0 runs the
  // mode asked for. The ScaleOut ends the other ranks when this function returns.
  std::unique_ptr<ScaleOut> scale_out;
  if (o.mpi) {
    K3_ASSIGN_OR_RETURN(scale_out, ScaleOut::Start(ScaleOutOptions{o.mpi_timeout, lines}));
    if (scale_out->rank() > 0) {
      RunOptions rank_o = o;
      rank_o.serve.serve = false;
      PlanOptions po = PlanOptionsFor(rank_o, io, false);
      po.sequences = 1;  // experts only: the caches and states live on rank 0
      po.spec_rows = 0;
      po.budget.experts_only = true;  // and the trunk: its budget is all expert cache
      return scale_out->RunRank(o.prepared, o.model_dir, po);
    }
  } else if (o.mpi_timeout != 300) {
    return Status::Invalid("--mpi-timeout needs --mpi");
  }
  if (o.serve.web && !o.serve.serve) return Status::Invalid("--web needs --serve");
  if (o.serve.serve) return Serve(o, io, env, isa, lines, scale_out.get());
  if (o.batch) return RunBatchMode(o, io, env, isa, out, lines, scale_out.get());
  if (o.max_seqs) return Status::Invalid("--max-seqs needs --batch or --serve");
  K3_ASSIGN_OR_RETURN(PromptInput input, ReadPromptInput(env, io, o));
  K3_RETURN_IF_ERROR(CheckPreparedPath(env, o.prepared));
  Result<std::unique_ptr<Engine>> opened = Engine::Open(env, o.prepared, o.model_dir);
  if (!opened.ok()) return ExplainOpenFailure(env, o.prepared, opened.status());
  std::unique_ptr<Engine> engine = std::move(opened).value();
  K3_RETURN_IF_ERROR(AttachScaleOut(scale_out.get(), engine.get(), o));
  K3_ASSIGN_OR_RETURN(int64_t P, ResolvePrompt(*engine, o, &input));
  K3_ASSIGN_OR_RETURN(const CliConstraint constraint,
                      LoadCliConstraint(env, engine->tokenizer(), o));
  K3_ASSIGN_OR_RETURN(int64_t held, HeldByState(env, *engine, o));
  if (o.chat) K3_RETURN_IF_ERROR(OpenChatVision(*engine, &input));
  K3_RETURN_IF_ERROR(PlanRun(engine.get(), o, io, P, held, lines,
                             input.vision && !o.chat
                                 ? VisionEncoder::RowBytes(input.vision->dims(),
                                                           input.image_tokens())
                                 : 0,
                             o.chat ? input.vision.get() : nullptr));
  K3_RETURN_IF_ERROR(EncodePromptImages(engine.get(), &input));
  if (lines && engine->streaming_plan()) LogInfo(engine->streaming_plan()->Describe());
  PrefillProgress prefill(lines ? ResolvedProgressMode(o.output.progress) : ProgressMode::kNone,
                          engine->chunk(), [](std::string_view s) {
                            if (!Quiet()) WriteStderr(s);
                          });
  engine->SetEventSink([&prefill](const EngineEvent& e) {
    if (e.kind == EngineEvent::Kind::kPrefill) prefill.Update(e.done, e.total, e.seconds);
  });
  const std::optional<Bandwidths> bandwidths = ProbeFloor(env, *engine, o, lines);
  K3_ASSIGN_OR_RETURN(std::unique_ptr<CacheTraceWriter> trace, OpenTrace(env, *engine, o));
  K3_RETURN_IF_ERROR(engine->LoadWeights(trace.get()));
  if (lines) {
    LogPlan(*engine, isa, o.chat);
  }
  const uint64_t seed = ChooseSeed(o);
  if (o.chat && !o.save_state.empty()) {
    return Status::Invalid("--save-state is for prompt runs; a chat with --history saves its "
                           "state beside the transcript (HISTORY.state)");
  }
  if (o.chat) return RunChat(engine.get(), o, io, env, seed, lines, out, constraint, &input);
  const bool terminal = !io.write_stdout && ::isatty(1) == 1;
  K3_ASSIGN_OR_RETURN(PromptRun run,
                      Generate(engine.get(), env, o, &input, seed, terminal, out, constraint));
  RunReport r = BuildReport(*engine, o, isa, input.ids, run, bandwidths);
  r.images = input.image_stats.images;
  r.image_tokens = input.image_stats.tokens;
  r.tower_seconds = input.image_stats.tower_seconds;
  r.vision_load_seconds = input.image_stats.load_seconds;
  if (scale_out) r.scale_out = scale_out->Stats();
  return Report(env, *engine, o, r, trace.get(), lines);
}

namespace {

void AddPromptFlags(CLI::App* app, RunOptions* o) {
  app->add_option("PREPARED", o->prepared, "prepared directory (k3prep pack)")->required();
  app->add_option("--ids", o->ids, "prompt token ids, comma-separated: 1,2,3");
  app->add_option_function<std::string>(
      "--prompt", [o](const std::string& v) { o->prompt = v; },
      "prompt text (special tokens such as [BOS] are recognised)");
  app->add_option_function<std::string>(
      "--prompt-file", [o](const std::string& v) { o->prompt_file = v; },
      "read the prompt text from PATH, or standard input for - (bytes verbatim; special tokens "
      "recognised)");
  app->add_option("--image", o->images,
                  "an image (PNG or JPEG) for --prompt/--prompt-file, repeatable: the prompt "
                  "becomes one user message of the images then the text (docs/VISION.md)")
      ->type_name("FILE")
      ->allow_extra_args(false);
  app->add_flag("--chat", o->chat, "interactive chat on stdin (/help, /reset, /exit, /image)");
  app->add_option_function<std::string>(
      "--system", [o](const std::string& v) { o->system = v; }, "chat: the system message");
  app->add_option("--history", o->history,
                  "chat: JSONL transcript to resume and to save after every turn");
  app->add_flag("--no-think", o->no_think, "chat: thinking channel off (default on)");
  app->add_option_function<std::string>(
      "--thinking-effort", [o](const std::string& v) { o->effort = v; },
      "chat: low|high|max (default max)");
  app->add_flag("--hide-thinking", o->hide_thinking,
                "chat: the model still thinks, but only the answer is printed (thinking is "
                "dimmed on a terminal, between <think> and </think> lines otherwise)");
}

// The sampling steps in the order they run (k3run/engine/sampler.h), for --help.
constexpr const char kSamplingOrder[] =
    "Sampling runs these steps in this order: penalties (repeat, frequency, presence; over the "
    "last --repeat-last-n ids, prompt included) -> top-k -> top-p -> min-p -> temperature -> "
    "draw. The truncations see the untempered distribution. Without --temperature, or with "
    "--temperature 0, decoding is greedy (the argmax of the penalised logits, lowest id on "
    "ties); --top-k, --top-p, --min-p or --seed alone sample at temperature 1.";

// Parsed here: CLI11 would wrap "-1" into 2^64 − 1 for an unsigned option.
void AddSeedFlag(CLI::App* app, RunOptions* o) {
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
      "sampler seed (PCG32 via SplitMix64; same seed, same tokens; default: random, printed)");
}

void AddPenaltyFlags(CLI::App* app, RunOptions* o) {
  SamplerOptions& so = o->sampling;
  app->add_option("--repeat-penalty", so.repeat_penalty,
                  "divide a positive logit (multiply a negative one) of each id among the last "
                  "--repeat-last-n by this (1: off)")
      ->check(AboveZero(1e6))
      ->capture_default_str();
  app->add_option("--repeat-last-n", so.repeat_last_n,
                  "how many of the latest ids (prompt included) the penalties look at (0: none)")
      ->check(AtLeast(0))
      ->capture_default_str()
      ->each([o](const std::string&) { o->sampling.repeat_last_n_set = true; });
  app->add_option("--presence-penalty", so.presence_penalty,
                  "subtract this from the logit of each id among the last --repeat-last-n (0: off)")
      ->check(InRange(-1e6, 1e6))
      ->capture_default_str();
  app->add_option("--frequency-penalty", so.frequency_penalty,
                  "subtract this times its count from the logit of each id among the last "
                  "--repeat-last-n (0: off)")
      ->check(InRange(-1e6, 1e6))
      ->capture_default_str();
}

void AddSamplingFlags(CLI::App* app, RunOptions* o) {
  app->add_option_function<double>(
      "--temperature", [o](const double& v) { o->sampling.temperature = v; },
      "sample at this temperature (> 0); 0 or not given: greedy")
      ->check(InRange(0, 1e6));
  app->add_option_function<int64_t>(
      "--top-k", [o](const int64_t& v) { o->sampling.top_k = v; },
      "sample from the K most likely tokens (default 0: all)")
      ->check(AtLeast(0));
  app->add_option_function<double>(
      "--top-p", [o](const double& v) { o->sampling.top_p = v; },
      "sample from the smallest set of tokens with this probability mass, (0, 1] (default 1)")
      ->check(AboveZero(1));
  app->add_option_function<double>(
      "--min-p", [o](const double& v) { o->sampling.min_p = v; },
      "drop tokens less likely than this times the most likely one, [0, 1] (default 0: off)")
      ->check(InRange(0, 1));
  AddSeedFlag(app, o);
  AddPenaltyFlags(app, o);
}

void AddRunControlFlags(CLI::App* app, RunOptions* o) {
  app->add_flag("--mpi", o->mpi,
                "run as one rank of `mpirun -np N k3run PREPARED --mpi …`: rank 0 runs the "
                "model, the others compute their range of routed experts (docs/SCALE-OUT.md)");
  app->add_option("--mpi-timeout", o->mpi_timeout,
                  "--mpi: seconds rank 0 waits for one layer's experts from a rank before it "
                  "ends the run (default 300)")
      ->check(AboveZero(86400));
  app->add_option("--gen", o->gen,
                  "at most this many tokens (0: prefill only; chat: per turn, default 2048)")
      ->check(AtLeast(0))
      ->capture_default_str()
      ->each([o](const std::string&) { o->gen_set = true; });
  app->add_flag("--ignore-eos", o->ignore_eos,
                "do not stop at the model's end tokens ([EOS], <|end_of_msg|>): exactly --gen "
                "tokens (benchmarks)");
  app->add_option("--stop", o->stop_strings,
                  "stop when the generated text contains STRING (repeatable; not printed)")
      ->type_name("STRING");
  app->add_option("--stop-id", o->stop_ids, "stop after generating this id (repeatable)");
  app->add_flag("--show-special", o->show_special,
                "print special tokens ([EOS], <|reserved_token_N|>...) as text");
  app->add_flag("-v,--verbose", o->verbose,
                "one stderr line per step (time, bytes read, expert hits); always in --out");
  app->add_option("--grammar", o->grammar_file,
                  "constrain the output to a GBNF grammar FILE (llama.cpp's syntax; docs/TOOLS.md)");
  app->add_option("--json-schema", o->json_schema_file,
                  "constrain the output to JSON matching the schema FILE (chat: the answer)");
  app->add_option("--tools", o->tools_file,
                  "chat: an OpenAI `tools` JSON array FILE; replies may call them, you type "
                  "each result");
  app->add_option("--tool-choice", o->tool_choice,
                  "chat with --tools: auto (default), none, required, or a function's name "
                  "(forces a call)");
  app->add_option("--spec", o->spec,
                  "speculative decoding: verify up to N prompt-lookup draft tokens per pass "
                  "(greedy only; with --batch/--serve sampled and constrained requests decode "
                  "without drafts; same ids; 0: off)")
      ->default_val(0);
  app->add_flag("--spec-fixed", o->spec_fixed,
                "with --spec: draft N whenever the lookup finds N (no adaptation; to measure "
                "what drafts cost)");
  app->add_option("--spec-oracle", o->spec_oracle,
                  "diagnostic: with --spec, draft from these ids (a plain run's generated ids) "
                  "instead of the lookup: synthetic weights never repeat text");
  app->add_flag("--recompute", o->recompute,
                "re-run the whole prefix every step (the check path; same bits, O(T^2))");
  app->add_option("--layers", o->layers, "run only the first N layers (NOT the model; default: all)")
      ->check(AtLeast(1));
  app->add_option("--threads", o->threads,
                  "compute threads (never changes a bit; default OMP_NUM_THREADS or all cores)")
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
}

void AddContextFlags(CLI::App* app, RunOptions* o) {
  app->add_option_function<int64_t>(
         "--ctx", [o](const int64_t& v) { o->ctx = v; },
         "positions reserved for the sequence (latent caches); default: prompt + --gen, and in "
         "chat the largest of 32768, 16384, … the memory plan allows (printed)")
      ->check(InRange(int64_t{1}, kMaxPositions));
  app->add_option("--chunk", o->chunk,
                  "rows per pass when feeding a long prompt (same bits at every size); default: "
                  "the largest the memory plan allows, at most " +
                      std::to_string(kDefaultMaxChunk))
      ->check(InRange(int64_t{1}, kMaxPositions));
  app->add_option("--save-state", o->save_state,
                  "after the run, save the sequence (tokens, caches, states) to PATH");
  app->add_option("--load-state", o->load_state,
                  "continue the sequence saved in PATH: the prompt is fed after its tokens");
}

void AddMemoryFlags(CLI::App* app, RunOptions* o) {
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
         "stream weights within this TOTAL budget (GB = 10^9 bytes): trunk first, then experts "
         "(default: every weight held in RAM)")
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
}

}  // namespace

void AddServeFlags(CLI::App* app, ServeOptions* o) {
  app->add_flag("--serve", o->serve,
                "serve an OpenAI-compatible HTTP API instead of running a prompt (docs/SERVER.md)");
  app->add_option("--host", o->host, "--serve: the address to listen on")->capture_default_str();
  app->add_option("--port", o->port, "--serve: the port (0: any free port, printed)")
      ->check(InRange(0, 65535))
      ->capture_default_str();
  app->add_option("--queue", o->queue,
                  "--serve: requests that may wait for a free sequence; past it: 429")
      ->check(InRange(0, 4096))
      ->capture_default_str();
  app->add_flag("--web", o->web, "--serve: a chat page at / (docs/SERVER.md \"Web chat page\")");
  app->add_option("--api-key-file", o->api_key_file,
                  "--serve: require 'Authorization: Bearer KEY' with the key in this file");
  app->add_option("--prompt-cache-gb", o->prompt_cache_gb,
                  "--serve: memory for snapshots at the ends of recent prompts (0: off)")
      ->check(InRange(0.0, kMaxBudgetGb));
  app->add_option("--header-timeout", o->limits.head_seconds,
                  "--serve: seconds a request's head may take to arrive (then 408); also how "
                  "long an idle keep-alive connection stays open")
      ->check(InRange(0.1, 3600.0))
      ->capture_default_str();
  app->add_option("--body-timeout", o->limits.body_seconds,
                  "--serve: seconds a request's body may take to arrive after its head (then 408)")
      ->check(InRange(0.1, 3600.0))
      ->capture_default_str();
  app->add_option("--max-connections", o->limits.max_connections,
                  "--serve: open connections at most; past it the one that waited longest for "
                  "its request is closed (503)")
      ->check(InRange(1, 65536))
      ->capture_default_str();
  app->add_option("--max-image-tokens", o->max_image_tokens,
                  "--serve: image tokens one request may hold (400 past it); the memory plan "
                  "holds the vision tower for them")
      ->check(InRange(1, 1 << 20))
      ->capture_default_str();
}

void AddRunFlags(CLI::App* app, RunOptions* o) {
  AddPromptFlags(app, o);
  AddSamplingFlags(app, o);
  AddRunControlFlags(app, o);
  AddContextFlags(app, o);
  AddMemoryFlags(app, o);
  AddBatchFlags(app, o);
  AddOutputFlags(app, &o->output);
  AddServeFlags(app, &o->serve);
}

int K3runMain(int argc, char** argv, const CliIo& io) {
  CLI::App app("k3run: text generation with Kimi K3 from a prepared directory", "k3run");
  RunOptions o;
  // --quiet is process state; an in-process caller (tests, a REPL host) starts each run afresh.
  SetQuiet(false);
  AddRunFlags(&app, &o);
  app.footer(kSamplingOrder);
  // Needs no PREPARED, like --help (the version of k3prep and k3verify).
  app.set_version_flag("--version", "k3run 0.1.0");
  // Needs no PREPARED: CLI11 runs flag callbacks before it checks required positionals.
  app.add_flag_callback(
      "--list-presets",
      [&io] {
        const std::string text = ListPresetsText();
        (void)(io.write_stdout ? io.write_stdout(text) : WriteFd1(text));
        throw CLI::Success();
      },
      "print the memory presets and exit");
  // Only the real process handles Ctrl-C (an in-process host keeps its own handler).
  if (!io.write_stdout) InstallInterruptHandler();
  return RunCli(app, argc, argv, [&] { return RunK3run(o, io); });
}

}  // namespace k3::run
