#include "k3prep/download/command.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/log.h"
#include "common/progress.h"
#include "k3prep/download/download.h"

namespace k3::prep {
namespace {

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

Result<std::string> CleanToken(std::string t, const std::string& source) {
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' ||
                        t.back() == '\t')) {
    t.pop_back();
  }
  size_t b = 0;
  while (b < t.size() && (t[b] == ' ' || t[b] == '\t')) ++b;
  t = t.substr(b);
  for (char c : t) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Status::Invalid("the token from " + source + " contains a control character "
                             "(several lines?); it must be one line holding only the token");
    }
  }
  return t;
}

class DownloadApp : public CLI::App {
 public:
  explicit DownloadApp(const OutputOptions* parent_out)
      : CLI::App("download a checkpoint from the Hugging Face Hub: resumable, parallel, every "
                 "file SHA-256 verified (docs/DOWNLOAD.md)",
                 "download"),
        parent_out_(parent_out) {
    add_option("REPO", opts.repo, "Hub repo id, e.g. moonshotai/Kimi-K3")->required();
    add_option("--dest", opts.dest, "download directory (created if missing)")->required();
    add_option("--revision", opts.revision, "branch, tag or commit; resolved once to a commit")
        ->default_val("main");
    add_option("--include", opts.includes,
               "also download files matching this glob ('*' matches '/' too; repeatable)")
        ->allow_extra_args(false);
    add_option("--jobs", opts.jobs, "files downloaded in parallel")
        ->default_val(4)
        ->check(InRange(1, 64));
    add_option("--connections-per-file", connections_,
               "ranged connections per file (only 1 is implemented)")
        ->default_val(1)
        ->check(InRange(1, 1));
    add_option("--token-file", token_file_, "file holding the Hub token (else HF_TOKEN, "
                                            "HF_TOKEN_PATH, $HF_HOME/token)");
    add_option("--stall-bytes-per-s", opts.stall_bytes_per_s,
               "a transfer slower than this for --stall-seconds is a stall: retried")
        ->default_val(65536)
        ->check(AtLeast(1));
    add_option("--stall-seconds", opts.stall_seconds, "see --stall-bytes-per-s")
        ->default_val(60)
        ->check(InRange(1, 86400));
    add_option("--retry-max", opts.retry_max,
               "attempts in a row without new bytes before a file is given up")
        ->default_val(5)
        ->check(InRange(0, 1000));
    add_option("--backoff-base-ms", opts.backoff_base_ms,
               "first retry wait; doubles per retry, capped at 8 s, jittered")
        ->default_val(1000)
        ->check(InRange(0, 8000));
    AddOutputFlags(this, &own_out_);
  }

  Status Run() {
    opts.progress = own_out_.progress;
    if (parent_out_ != nullptr && (parent_out_->quiet || own_out_.quiet)) {
      opts.progress = ProgressMode::kNone;
    } else if (parent_out_ != nullptr && count("--progress") == 0) {
      opts.progress = parent_out_->progress;
    }
    const std::string endpoint = Getenv("HF_ENDPOINT");
    if (!endpoint.empty()) opts.endpoint = endpoint;
    std::string source;
    K3_ASSIGN_OR_RETURN(opts.token, LoadHubToken(Env::Default(), token_file_, &source));
    LogInfo(opts.token.empty() ? "no Hub token (public repos only)"
                               : "using the Hub token from " + source);
    download::DownloadResult result;
    Status s = download::RunDownload(Env::Default(), opts, &result);
    if (!result.files.empty()) LogInfo("summary:\n" + download::FormatDownloadTable(result));
    if (s.ok()) LogInfo("next: k3verify shards " + opts.dest + " --manifest " + opts.dest +
                        "/k3-download.json");
    return s;
  }

  download::DownloadOptions opts;

 private:
  const OutputOptions* parent_out_;
  OutputOptions own_out_;
  std::string token_file_;
  int connections_ = 1;
};

}  // namespace

Result<std::string> LoadHubToken(Env* env, const std::string& token_file, std::string* source) {
  std::string path = token_file;
  if (!path.empty()) {
    *source = "--token-file " + path;
  } else if (!Getenv("HF_TOKEN").empty()) {
    *source = "HF_TOKEN";
    return CleanToken(Getenv("HF_TOKEN"), *source);
  } else if (!Getenv("HF_TOKEN_PATH").empty()) {
    path = Getenv("HF_TOKEN_PATH");
    *source = "HF_TOKEN_PATH " + path;
  } else {
    const std::string home = Getenv("HF_HOME").empty()
                                 ? (Getenv("HOME").empty() ? "" : Getenv("HOME") + "/.cache/huggingface")
                                 : Getenv("HF_HOME");
    if (home.empty() || !env->Exists(home + "/token")) return std::string();
    path = home + "/token";
    *source = path;
  }
  Result<std::string> text = ReadFileToString(env, path, 1 << 16);
  if (!text.ok()) return text.status().WithContext("reading the Hub token (" + *source + ")");
  return CleanToken(*text, *source);
}

CLI::App* AddDownloadCommand(CLI::App* app, const OutputOptions* out) {
  return app->add_subcommand(std::make_shared<DownloadApp>(out));
}

Status RunDownloadCommand(CLI::App* cmd) {
  auto* d = dynamic_cast<DownloadApp*>(cmd);
  if (d == nullptr) return Status::Invalid("internal: RunDownloadCommand needs AddDownloadCommand");
  return d->Run();
}

}  // namespace k3::prep
