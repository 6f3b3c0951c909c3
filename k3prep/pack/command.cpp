#include "k3prep/pack/command.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/log.h"
#include "common/progress.h"
#include "common/sysinfo.h"
#include "k3prep/pack/pack.h"

namespace k3::prep {
namespace {

// The subcommand owns its flag storage, so the tool's main needs one call to register it.
class PackApp : public CLI::App {
 public:
  PackApp(const OutputOptions* parent_out)
      : CLI::App("turn a checkpoint into the prepared directory k3run reads (docs/FORMATS.md)",
                 "pack"),
        parent_out_(parent_out) {
    opts.jobs = std::min(CoreCount(), 2);
    add_option("MODEL_DIR", opts.model_dir,
               "checkpoint directory: *.safetensors shards + config.json (tokenizer files and "
               "k3-download.json are used when present)")
        ->required();
    add_option("--out", opts.out, "the prepared directory to write (PREPARED)")->required();
    add_option("--experts", experts,
               "link: experts stay in the shards (paths relative to MODEL_DIR); copy: experts "
               "are copied into PREPARED/experts or the --stripe directories")
        ->check(CLI::IsMember({"link", "copy"}))
        ->default_val("link");
    add_option("--stripe", opts.stripe_dirs,
               "copy mode: spread experts over these directories (expert e of layer L goes to "
               "dir (L*n_experts+e) mod n)")
        ->delimiter(',')
        ->type_name("DIR1,DIR2,...");
    add_flag("--no-vision", [this](int64_t) { opts.vision = false; },
             "leave out the vision tower and projector: a text-only PREPARED (k3run then "
             "refuses --image with \"no vision\")");
    add_flag("--resume", opts.resume,
             "continue an interrupted pack: finished parts are re-verified by hash and kept");
    add_option("--jobs", opts.jobs, "1: read, hash and write in turn; 2+: read ahead in a "
                                    "second thread (the result never depends on it)")
        ->check(InRange(1, 256));
    AddOutputFlags(this, &own_out);
  }

  Status Run() {
    opts.experts = experts == "copy" ? prepared::ExpertsMode::kCopy : prepared::ExpertsMode::kLink;
    opts.progress = own_out.progress;
    if (parent_out_ != nullptr && (parent_out_->quiet || own_out.quiet)) {
      opts.progress = ProgressMode::kNone;
    } else if (parent_out_ != nullptr && count("--progress") == 0) {
      opts.progress = parent_out_->progress;
    }
    Result<PackResult> r = RunPack(Env::Default(), opts);
    if (!r.ok()) return r.status();
    if (r->already_complete) {
      LogInfo("resume: " + opts.out + " was already complete (k3.sum written); checked it and "
              "removed the journal the stopped pack left");
      LogInfo("next: k3verify prepared " + opts.out + " --deep");
      return Status::Ok();
    }
    const PackStats& s = r->stats;
    char rate[96];
    const double mbps =
        s.seconds > 0 ? static_cast<double>(s.bytes_read) / 1e6 / s.seconds : 0.0;
    std::snprintf(rate, sizeof rate, "%.1f s, %.1f MB/s read", s.seconds, mbps);
    LogInfo("packed " + opts.model_dir + " -> " + opts.out + " (experts " + experts + "): read " +
            FormatIecBytes(static_cast<double>(s.bytes_read)) + ", wrote " +
            FormatIecBytes(static_cast<double>(s.bytes_written)) + " in " + rate + " [" +
            s.read_backend + "]");
    if (opts.resume) {
      LogInfo("resume: reused " + std::to_string(s.units_reused) + " of " +
              std::to_string(s.units_total) + " units (" + std::to_string(s.regions_reused) +
              " regions, " + std::to_string(s.experts_reused) + " experts)");
    }
    LogInfo("next: k3verify prepared " + opts.out + " --deep");
    return Status::Ok();
  }

  PackOptions opts;
  std::string experts = "link";
  OutputOptions own_out;

 private:
  const OutputOptions* parent_out_;
};

}  // namespace

CLI::App* AddPackCommand(CLI::App* app, const OutputOptions* out) {
  return app->add_subcommand(std::make_shared<PackApp>(out));
}

Status RunPackCommand(CLI::App* cmd) {
  auto* pack = dynamic_cast<PackApp*>(cmd);
  if (pack == nullptr) return Status::Invalid("internal: RunPackCommand needs AddPackCommand's app");
  return pack->Run();
}

}  // namespace k3::prep
