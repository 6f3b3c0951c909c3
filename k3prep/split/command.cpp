#include "k3prep/split/command.h"

#include <cstdio>
#include <memory>
#include <string>

#include "common/env.h"
#include "common/log.h"
#include "common/progress.h"
#include "formats/expert_share.h"
#include "k3prep/split/split.h"

namespace k3::prep {
namespace {

std::string Bytes(uint64_t bytes) { return FormatIecBytes(static_cast<double>(bytes)); }

// The subcommand owns its flag storage, so the tool's main needs one call to register it.
class SplitApp : public CLI::App {
 public:
  explicit SplitApp(const OutputOptions* parent_out)
      : CLI::App("write the share of a prepared directory that MPI rank R of an N-rank run needs: "
                 "the whole trunk and only rank R's experts (docs/SCALE-OUT.md)",
                 "split"),
        parent_out_(parent_out) {
    add_option("PREPARED", opts.prepared,
               "the full prepared directory (k3prep pack --out; link or copy mode)")
        ->required();
    add_option("--ranks", opts.ranks, "N: the ranks of the run (mpirun -np N)")
        ->required()
        ->check(InRange(1, prepared::kMaxRanks));
    add_option("--rank", opts.rank, "R: the rank this share is for, 0 to N-1")
        ->required()
        ->check(InRange(0, prepared::kMaxRanks - 1));
    add_option("--out", opts.out, "the share to write (DIR): a new or empty directory")
        ->required();
    add_option("--model-dir", opts.model_dir,
               "link mode: where PREPARED's source shards are now (default: k3.json's model_dir)");
    AddOutputFlags(this, &own_out);
  }

  Status Run() {
    opts.progress = own_out.progress;
    if (parent_out_ != nullptr && (parent_out_->quiet || own_out.quiet)) {
      opts.progress = ProgressMode::kNone;
    } else if (parent_out_ != nullptr && count("--progress") == 0) {
      opts.progress = parent_out_->progress;
    }
    Result<SplitResult> r = RunSplit(Env::Default(), opts);
    if (!r.ok()) return r.status();
    const SplitStats& s = r->stats;
    char rate[96];
    const double mbps = s.seconds > 0 ? static_cast<double>(s.bytes_read) / 1e6 / s.seconds : 0.0;
    std::snprintf(rate, sizeof rate, "%.1f s, %.1f MB/s", s.seconds, mbps);
    LogInfo("split " + opts.prepared + " -> " + opts.out + ": rank " + std::to_string(opts.rank) +
            " of " + std::to_string(opts.ranks) + ", experts " + std::to_string(s.experts_held) +
            " of " + std::to_string(s.experts_total) + " (" + Bytes(s.expert_bytes) + "), trunk " +
            Bytes(s.trunk_bytes) + " + resident " + Bytes(s.resident_bytes) + "; read and verified " +
            Bytes(s.bytes_read) + ", wrote " + Bytes(s.bytes_written) + " in " + rate);
    LogInfo("map: " + prepared::ExpertMap{opts.ranks, r->manifest.config.n_experts}.Describe());
    LogInfo("next: k3verify prepared " + opts.out + " --deep");
    return Status::Ok();
  }

  SplitOptions opts;
  OutputOptions own_out;

 private:
  const OutputOptions* parent_out_;
};

}  // namespace

CLI::App* AddSplitCommand(CLI::App* app, const OutputOptions* out) {
  return app->add_subcommand(std::make_shared<SplitApp>(out));
}

Status RunSplitCommand(CLI::App* cmd) {
  auto* split = dynamic_cast<SplitApp*>(cmd);
  if (split == nullptr) {
    return Status::Invalid("internal: RunSplitCommand needs AddSplitCommand's app");
  }
  return split->Run();
}

}  // namespace k3::prep
