#include "k3run/app/chat_session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "k3run/app/chat_display.h"
#include "k3run/app/chat_images.h"
#include "k3run/app/interrupt.h"
#include "k3run/engine/stop_rules.h"
#include "k3run/text/chat_history.h"
#include "k3run/text/utf8.h"

namespace k3::run {

namespace {

const char kHelp[] =
    "commands: /help (this text), /reset (forget the conversation, keep the system message), "
    "/image FILE (a PNG or JPEG for your next message; /image alone lists them), "
    "/exit (or end of input). Anything else is your message.\n";

// "[prompt 37 ids in 0.21 s (176.2 tok/s); 12 tokens in 0.48 s (25.0 tok/s, 0.040 s/token)]":
// the prefill (step 0) apart from the decode steps, so the per-token rate is not diluted.
// With images, after the prompt's figures: "; 1 image: 12 image tokens, tower 0.03 s".
std::string TurnRateLine(const GenerateResult& r, const ImageStats& images) {
  if (r.steps.empty()) return "";
  const StepRecord& prefill = r.steps.front();
  double decode_s = 0;
  for (size_t i = 1; i < r.steps.size(); ++i) decode_s += r.steps[i].seconds;
  const auto decoded = static_cast<double>(r.steps.size() - 1);
  char buf[256];
  std::snprintf(buf, sizeof buf, "[prompt %lld ids in %.2f s (%.1f tok/s)",
                static_cast<long long>(prefill.tokens_in), prefill.seconds,
                prefill.seconds > 0 ? double(prefill.tokens_in) / prefill.seconds : 0.0);
  std::string line = buf;
  if (images.images > 0) {
    std::snprintf(buf, sizeof buf, "; %lld image%s: %lld image tokens, tower %.2f s",
                  static_cast<long long>(images.images), images.images == 1 ? "" : "s",
                  static_cast<long long>(images.tokens), images.tower_seconds);
    line += buf;
    if (images.load_seconds > 0) {
      std::snprintf(buf, sizeof buf, " (vision.bin read in %.2f s)", images.load_seconds);
      line += buf;
    }
  }
  line += "; " + std::to_string(r.generated.size()) + " tokens";
  if (decoded > 0 && decode_s > 0) {
    std::snprintf(buf, sizeof buf, ", decode %.2f s (%.2f tok/s, %.3f s/token)", decode_s,
                  decoded / decode_s, decode_s / decoded);
    line += buf;
  }
  return line + "]";
}

class Session {
 public:
  Session(Engine* engine, const ChatTemplate& tmpl, const ChatOptions& o, const ChatIo& io)
      : engine_(engine), tok_(*engine->tokenizer()), tmpl_(tmpl), o_(o), io_(io) {}

  Status Run() {
    K3_RETURN_IF_ERROR(LoadInitial());
    K3_RETURN_IF_ERROR(LoadState());
    if (!messages_.empty() && (messages_.back().role == "user" || messages_.back().role == "tool")) {
      Note("resuming the unanswered user turn of " + o_.history_path + "\n");
      K3_RETURN_IF_ERROR(Answer());
    }
    Note(std::string("chat: ") + (o_.tmpl.thinking ? "thinking_effort=" + o_.tmpl.effort
                                                    : std::string("thinking off")) +
         ", " + (o_.sampling.sampling() ? "sampling" : "greedy") + ", /help for commands\n");
    while (true) {
      Note("> ");
      std::optional<std::string> line = io_.read_line();
      if (!line) {
        Note("\n");  // end the "> " prompt line at end of input
        break;
      }
      if (!line->empty() && line->back() == '\r') line->pop_back();
      if (line->find_first_not_of(" \t") == std::string::npos) continue;
      if (*line == "/exit") break;
      if (*line == "/help") {
        Note(kHelp);
        continue;
      }
      if (*line == "/image" || line->starts_with("/image ")) {
        AddImage(line->substr(6));
        continue;
      }
      if (*line == "/reset") {
        if (!pending_.empty()) {
          Note("dropped the " + std::to_string(pending_.size()) + " image(s) waiting\n");
        }
        pending_.clear();
        images_.clear();  // the initial messages are the system message only: no images
        messages_ = initial_;
        if (seq_ != nullptr) seq_->Reset();
        K3_RETURN_IF_ERROR(Save());
        K3_RETURN_IF_ERROR(SaveState());
        Note("conversation reset\n");
        continue;
      }
      if ((*line)[0] == '/') {
        Note("unknown command " + *line + "; " + kHelp);
        continue;
      }
      // Typed bytes that are not UTF-8 are replaced before encoding (DESIGN.md §6 "Text").
      ChatMessage user{"user", SanitizeUtf8(*line), ""};
      for (ChatImageFile& f : pending_) {  // before the text, in the order they were given
        user.images.push_back(f.view);
        images_.push_back(std::move(f.input));
      }
      pending_.clear();
      messages_.push_back(std::move(user));
      K3_RETURN_IF_ERROR(Answer());
    }
    return Status::Ok();
  }

 private:
  void Note(const std::string& s) const {
    if (io_.write_stderr) io_.write_stderr(s);
  }

  // /image PATH: read and check now, attach to the next message. /image alone lists them.
  // Every failure is a notice; the chat goes on with nothing attached.
  void AddImage(std::string_view arg) {
    const size_t b = arg.find_first_not_of(" \t"), e = arg.find_last_not_of(" \t");
    if (b == std::string_view::npos) {
      if (pending_.empty()) Note("no image waiting; /image FILE attaches one to your next message\n");
      for (size_t k = 0; k < pending_.size(); ++k) {
        const ChatImage& v = pending_[k].view;
        Note("image " + std::to_string(k + 1) + ": " + v.path + ", " + std::to_string(v.width) +
             "x" + std::to_string(v.height) + ", " + std::to_string(v.tokens) + " tokens\n");
      }
      return;
    }
    const std::string path(arg.substr(b, e - b + 1));
    if (o_.vision == nullptr) {
      Note("/image " + path + ": " + o_.no_vision + "; the chat goes on without images\n");
      return;
    }
    Result<ChatImageFile> f = LoadChatImage(io_.env, path);
    if (!f.ok()) {
      Note("/image: " + f.status().message() + "; nothing attached\n");
      return;
    }
    const int64_t positions = engine_->memory_plan().positions;
    const int64_t limit = ChatImageLimit(positions);
    if (f->view.tokens > limit) {
      Note("/image " + path + ": the image needs " + std::to_string(f->view.tokens) +
           " tokens, more than this chat's context of " + std::to_string(positions) +
           " positions takes for one image (" + std::to_string(limit) +
           "); nothing attached: use a smaller image, or restart with a larger --ctx\n");
      return;
    }
    // What waits must fit what is left of the context (it bounds the patches held, too).
    int64_t waiting = f->view.tokens;
    for (const ChatImageFile& p : pending_) waiting += p.view.tokens;
    const int64_t left = positions - (seq_ != nullptr ? seq_->length() : 0);
    if (waiting >= left) {
      Note("/image " + path + ": with the images waiting, your next message would hold " +
           std::to_string(waiting) + " image tokens, and " + std::to_string(left) + " of the " +
           "context's " + std::to_string(positions) + " positions are left; nothing attached: "
           "send the message, or /reset\n");
      return;
    }
    Note("[image " + std::to_string(pending_.size() + 1) + ": " + path + ", " +
         std::to_string(f->view.width) + "x" + std::to_string(f->view.height) + ", " +
         std::to_string(f->view.tokens) + " tokens; it goes with your next message]\n");
    pending_.push_back(std::move(f).value());
  }

  // The images of a resumed transcript, read again and checked against what it recorded.
  Status ReloadImages() {
    for (size_t i = 0; i < messages_.size(); ++i) {
      for (const ChatImage& image : messages_[i].images) {
        const std::string where = o_.history_path + ":" + std::to_string(i + 1);
        if (o_.vision == nullptr) {
          return Status::Invalid(where + ": the message has the image " + image.path + ", and " +
                                 o_.no_vision + "; use a prepared directory with vision, or a "
                                 "new --history");
        }
        K3_ASSIGN_OR_RETURN(ImageInput input, ReloadChatImage(io_.env, image, where));
        images_.push_back(std::move(input));
      }
    }
    return Status::Ok();
  }

  Status LoadInitial() {
    if (!o_.history_path.empty()) {
      K3_ASSIGN_OR_RETURN(messages_, LoadHistory(io_.env, o_.history_path));
    }
    if (o_.system) {
      const bool has_system = !messages_.empty() && messages_[0].role == "system";
      if (messages_.empty()) {
        messages_.push_back({"system", SanitizeUtf8(*o_.system), ""});
      } else if (!has_system || messages_[0].content != *o_.system) {
        return Status::Invalid("--system disagrees with the first message of " +
                               o_.history_path + " (" +
                               (has_system ? "a different system message" : "no system message") +
                               "); drop --system to continue that conversation, or use a new "
                               "--history file");
      }
    }
    K3_RETURN_IF_ERROR(ReloadImages());
    if (!messages_.empty() && messages_[0].role == "system") initial_ = {messages_[0]};
    for (const ChatMessage& m : messages_) turn_ += m.role == "assistant" ? 1 : 0;
    return Status::Ok();
  }

  // The sequence beside the transcript (ChatOptions::state_path), so a resumed chat does not
  // re-read the conversation. Loaded only when it is a prefix of what the history renders.
  Status LoadState() {
    if (o_.state_path.empty() || !io_.env->Exists(o_.state_path)) return Status::Ok();
    seq_ = engine_->NewSequence(o_.sampling, o_.seed, turn_ + 1);
    K3_RETURN_IF_ERROR(engine_->LoadSequence(o_.state_path, seq_.get()));
    const std::vector<int32_t> rendered = tmpl_.Render(messages_, o_.tmpl, true);
    const std::vector<int32_t>& held = seq_->tokens();
    if (held.size() > rendered.size() || !std::equal(held.begin(), held.end(), rendered.begin())) {
      return Status::Invalid(o_.state_path + ": its " + std::to_string(held.size()) +
                             " ids are not the start of what " + o_.history_path +
                             " renders (" + std::to_string(rendered.size()) +
                             " ids with these chat options); delete the state file to re-read "
                             "the conversation, or use the options it was saved with");
    }
    Note("[resumed " + std::to_string(held.size()) + " positions from " + o_.state_path + "]\n");
    return Status::Ok();
  }

  // A sequence with images is not saved (the state file does not carry their rows): the last
  // text-only state stays, the start of what the transcript renders, and a resumed chat feeds
  // the rest, images encoded again.
  Status SaveState() {
    if (o_.state_path.empty() || seq_ == nullptr || !seq_->media().empty()) return Status::Ok();
    return engine_->SaveSequence(*seq_, o_.state_path);
  }

  Status Save() {
    if (o_.history_path.empty()) return Status::Ok();
    return SaveHistory(io_.env, o_.history_path, messages_);
  }

  // A reply, and with --tools as many more as its calls need: each call is shown on stdout,
  // its result read from stdin (one line; end of input stops), and the model continues with
  // the results. At most kMaxToolRounds replies per user message, so a model that calls
  // forever cannot keep the chat from its user.
  // --tool-choice (required or a function) forces the first reply only: the replies that
  // continue with the results choose freely (tool_choice auto), or a forced call would repeat
  // until the round limit.
  static constexpr int kMaxToolRounds = 16;
  Status Answer() {
    for (int round = 0; round < kMaxToolRounds; ++round) {
      K3_RETURN_IF_ERROR(Turn(/*first=*/round == 0));
      if (!o_.tools || messages_.empty() || messages_.back().role != "assistant") break;
      const std::vector<ToolCall> calls = messages_.back().tool_calls;
      if (calls.empty()) break;
      for (size_t k = 0; k < calls.size(); ++k) {
        K3_RETURN_IF_ERROR(io_.write_stdout("[tool call " + std::to_string(k + 1) + "] " +
                                            calls[k].name + " " + calls[k].arguments + "\n"));
        Note("result of " + calls[k].name + " (" + calls[k].id + ")> ");
        std::optional<std::string> result = io_.read_line();
        if (!result) {
          Note("\n[no result: the calls stay unanswered]\n");
          return Save();
        }
        if (!result->empty() && result->back() == '\r') result->pop_back();
        ChatMessage m{"tool", SanitizeUtf8(*result), ""};
        m.tool_call_id = calls[k].id;
        m.name = calls[k].name;
        messages_.push_back(std::move(m));
      }
    }
    return Status::Ok();
  }

  // The sequence persists across turns: each turn renders the conversation and feeds only what
  // the sequence does not hold yet (the previous reply's last token, the new message and the
  // generation prompt). Replies keep the ids they were generated as, so the rendering extends
  // the sequence exactly; anything else (/reset, a history without state) starts it afresh.
  Status Turn(bool first = true) {
    TemplateOptions tmpl = o_.tmpl;
    const bool forced = tmpl.tool_choice == "required" || tmpl.tool_choice == "function";
    if (!first && forced) tmpl.tool_choice = "auto";
    K3_ASSIGN_OR_RETURN(const std::vector<int32_t> rendered,
                        tmpl_.RenderChecked(messages_, tmpl, true));
    if (seq_ == nullptr) seq_ = engine_->NewSequence(o_.sampling, o_.seed, turn_ + 1);
    const std::vector<int32_t>& held = seq_->tokens();
    if (held.size() > rendered.size() || !std::equal(held.begin(), held.end(), rendered.begin())) {
      if (!held.empty()) Note("[the conversation changed: re-reading it]\n");
      seq_->Reset();
    }
    const std::vector<int32_t> feed(rendered.begin() + seq_->length(), rendered.end());
    const int64_t room = seq_->capacity() - seq_->length();
    const auto n = static_cast<int64_t>(feed.size());
    const int64_t gen = std::min<int64_t>(o_.gen, room - n + 1);  // the last token is not fed
    if (gen < 1) {
      Note("the message (" + std::to_string(n) + " ids) does not fit: " +
           std::to_string(seq_->length()) + " of the context's " +
           std::to_string(seq_->capacity()) +
           " positions are used; the message was dropped: /reset to start a new conversation, "
           "or restart with a larger --ctx\n");
      images_.resize(images_.size() - messages_.back().images.size());
      messages_.pop_back();
      return Status::Ok();
    }
    if (o_.progress) {
      Note("[" + std::to_string(n) + " new ids, " + std::to_string(seq_->length() + n) + " of " +
           std::to_string(seq_->capacity()) + " positions]\n");
    }
    ImageStats image_stats;
    K3_RETURN_IF_ERROR(EncodeNewImages(rendered, &image_stats));
    GenerateOptions g;
    g.prompt = feed;
    g.gen = gen;
    g.spec = o_.spec;
    g.stop_ids = EndTokenIds(&tok_);  // [EOS], <|end_of_msg|>: the stop rules of every mode
    seq_->sampler() = Sampler(o_.sampling, o_.seed, turn_ + 1);  // each turn its own stream
    ++turn_;
    ClearInterrupt();  // a Ctrl-C from here on stops this answer
    g.stop_requested = [] { return Interrupted(); };
    ChatDisplay display(tok_, tmpl_, {o_.tmpl.thinking, o_.hide_thinking, o_.terminal},
                        io_.write_stdout);
    auto on_step = [&](const StepRecord& s, const float*) -> Status {
      return s.token < 0 ? Status::Ok() : display.Token(s.token);
    };
    if (o_.make_constraint && (first || !forced)) {
      K3_ASSIGN_OR_RETURN(seq_->constraint(), o_.make_constraint());  // this reply's grammar
    }
    Result<GenerateResult> generated = Generate(engine_, seq_.get(), g, on_step);
    seq_->constraint().reset();
    K3_ASSIGN_OR_RETURN(GenerateResult r, std::move(generated));
    K3_RETURN_IF_ERROR(display.Finish());
    if (Interrupted()) Note("[answer stopped by Ctrl-C; Ctrl-C again to leave]\n");
    if (o_.progress) Note(TurnRateLine(r, image_stats) + "\n");
    if (!r.stopped_by_id && !Interrupted() && gen < o_.gen &&
        static_cast<int64_t>(r.generated.size()) == gen) {
      Note("[the context is full: the reply stopped at " + std::to_string(gen) +
           " tokens; /reset to start a new conversation, or restart with a larger --ctx]\n");
    }
    messages_.push_back(Reply(r.generated));
    K3_RETURN_IF_ERROR(Save());
    return SaveState();
  }

  // The images whose pads are in the ids about to be fed (rendered[length..]): each goes through
  // the tower once and its rows are bound to its pads. The images before them are in the
  // sequence already (their rows fed), so only the new ones are encoded; after a reset, all.
  Status EncodeNewImages(const std::vector<int32_t>& rendered, ImageStats* stats) {
    if (images_.empty()) return Status::Ok();
    const auto pad = static_cast<int32_t>(engine_->config().media_placeholder_token_id);
    const std::vector<int32_t> marked = ImagePadsOnly(rendered, tmpl_.ids().media_content, pad);
    const auto held = static_cast<size_t>(seq_->length());
    const auto done =
        static_cast<size_t>(CountPadRuns(std::span(marked).first(held), pad));
    if (done > images_.size()) {
      return Status::Invalid("internal: the sequence holds " + std::to_string(done) +
                             " images, the chat " + std::to_string(images_.size()) +
                             " (please report)");
    }
    if (done == images_.size()) return Status::Ok();
    K3_ASSIGN_OR_RETURN(std::vector<MediaSpan> spans,
                        EncodeImages(o_.vision, std::span(marked).subspan(held), seq_->length(),
                                     pad, std::span(images_).subspan(done), stats));
    return engine_->AttachMedia(seq_.get(), std::move(spans));
  }

  // The reply as the transcript keeps it: its text when it follows the template (or its plain
  // text, with a warning), and always the ids it was generated as.
  ChatMessage Reply(const std::vector<int32_t>& generated) const {
    Result<Completion> parsed = tmpl_.Parse(generated, o_.tmpl.thinking);
    ChatMessage reply{"assistant", "", "", generated};
    if (parsed.ok()) {
      reply.content = SanitizeUtf8(parsed->content);
      reply.reasoning = SanitizeUtf8(parsed->reasoning);
      reply.tool_calls = parsed->tool_calls;
    } else {
      Note("warning: " + parsed.status().message() + "; the reply is kept as plain text\n");
      std::vector<int32_t> text;
      for (int32_t id : generated) {
        if (!tmpl_.IsControl(id)) text.push_back(id);
      }
      reply.content = SanitizeUtf8(tok_.Decode(text));
    }
    return reply;
  }

  Engine* engine_;
  std::unique_ptr<Sequence> seq_;
  const tok::Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  const ChatOptions& o_;
  const ChatIo& io_;
  std::vector<ChatMessage> messages_;
  std::vector<ChatMessage> initial_;
  // The images of messages_, in the order they render (every user message's images, ascending
  // `at`): images_[k] is the k-th image block of the rendered transcript.
  std::vector<ImageInput> images_;
  std::vector<ChatImageFile> pending_;  // /image: waiting for the next message
  uint64_t turn_ = 0;
};

}  // namespace

Status RunChatSession(Engine* engine, const ChatTemplate& tmpl, const ChatOptions& o,
                      const ChatIo& io) {
  return Session(engine, tmpl, o, io).Run();
}

}  // namespace k3::run
