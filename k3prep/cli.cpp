#include "k3prep/cli.h"

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/env.h"
#include "common/log.h"
#include "common/progress.h"
#include "k3prep/doctor/command.h"
#include "k3prep/download/command.h"
#include "k3prep/pack/command.h"
#include "k3prep/split/command.h"
#include "k3prep/synth/checkpoint.h"

namespace k3::prep {
namespace {

struct SynthFlags {
  synth::SynthOptions opts;
  std::string small_dtype = "mixed";
};

// Decimal GB with two decimals, as DESIGN.md quotes sizes; small sizes in IEC units.
std::string Gb(uint64_t bytes) {
  if (bytes < 100'000'000) return FormatIecBytes(static_cast<double>(bytes));
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

void PrintSummary(const synth::SynthOptions& o, const synth::SynthResult& r) {
  const synth::Layout& l = r.layout;
  std::string text =
      std::string(o.dry_run ? "dry run: " : "") + "preset " + o.preset + ": " +
      std::to_string(l.config.n_layers) + " layers, " + std::to_string(l.tensors.size()) +
      " tensors in " + std::to_string(l.shards.size()) + " shards, " +
      Gb(l.total_file_bytes) + " (trunk " + Gb(l.trunk_bytes) + ", " +
      std::to_string(l.expert_count) + " experts of " + std::to_string(l.bytes_per_expert) +
      " bytes = " + Gb(l.expert_bytes) + ", embed + lm_head " + Gb(l.embed_lm_head_bytes) +
      (l.vision ? ", vision " + Gb(l.vision_bytes) : std::string(", no vision")) + ")";
  LogInfo(text);
  if (o.dry_run) {
    LogInfo("wrote " + JoinPath(o.out, "layout.json"));
  } else {
    const double mbps = r.seconds > 0 ? static_cast<double>(l.total_file_bytes) / 1e6 / r.seconds
                                      : 0.0;
    char rate[64];
    std::snprintf(rate, sizeof(rate), "%.1f s, %.1f MB/s", r.seconds, mbps);
    LogInfo("wrote " + o.out + " (seed " + std::to_string(o.seed) + ") in " + rate);
  }
}

void AddSynth(CLI::App* app, SynthFlags* f, OutputOptions* out) {
  CLI::App* cmd = app->add_subcommand(
      "synth", "make a synthetic K3 checkpoint in the exact released format (docs/SYNTH.md)");
  synth::SynthOptions& o = f->opts;
  cmd->add_option("--preset", o.preset, "tiny (~5 MB), small (~280 MB), bench (18.8 GB), full "
                                        "(the released dimensions, 1.56 TB)")
      ->required()
      ->check(CLI::IsMember({"tiny", "small", "bench", "full"}));
  cmd->add_option("--out", o.out, "output directory (created if missing)")->required();
  cmd->add_option("--seed", o.seed, "generator seed; the same seed gives byte-identical files")
      ->default_val(0);
  cmd->add_option("--shards", o.shards,
                  "pack consecutive units into N shards (default: one per layer, one "
                  "model-level shard, then the projector's and the vision tower's)")
      ->check(AtLeast(1));
  cmd->add_option("--small-dtype", f->small_dtype,
                  "dtype of every small vector: mixed (the release: F32 for A_log, dt_bias, conv, "
                  "o_norm, e_score_correction_bias; BF16 for norms), bf16 or f32")
      ->check(CLI::IsMember({"mixed", "bf16", "f32"}));
  cmd->add_option("--set", o.sets,
                  "override a config field by its config.json key, e.g. --set num_experts=64, "
                  "--set full_attn_layers=4,8,13 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_flag("--no-vision", [&o](int64_t) { o.vision = false; },
                "leave out the vision tower and projector (a text-only checkpoint: n_layers + 1 "
                "shards, no vision_config)");
  cmd->add_flag("--dry-run", o.dry_run, "write only DIR/layout.json (names, dtypes, shapes, "
                                        "shards, byte ranges); no weights");
  AddOutputFlags(cmd, out);
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app("k3prep: prepare Kimi K3 checkpoints (download, synth, pack, split, doctor)",
               "k3prep");
  app.require_subcommand(1);
  app.set_version_flag("--version", "k3prep 0.1.0");
  SynthFlags synth_flags;
  OutputOptions out;
  // --quiet and --progress before the subcommand too (DESIGN-NOTES "Progress"): each command
  // falls back to these when it was not given its own.
  AddOutputFlags(&app, &out);
  AddSynth(&app, &synth_flags, &out);
  CLI::App* pack_cmd = AddPackCommand(&app, &out);
  CLI::App* split_cmd = AddSplitCommand(&app, &out);
  CLI::App* download_cmd = AddDownloadCommand(&app, &out);
  CLI::App* doctor_cmd = AddDoctorCommand(&app, &out);
  return RunCli(app, argc, argv, [&]() -> Status {
    if (pack_cmd->parsed()) return RunPackCommand(pack_cmd);
    if (split_cmd->parsed()) return RunSplitCommand(split_cmd);
    if (download_cmd->parsed()) return RunDownloadCommand(download_cmd);
    if (doctor_cmd->parsed()) return RunDoctorCommand(doctor_cmd);
    synth::SynthOptions& o = synth_flags.opts;
    synth::ParseSmallDType(synth_flags.small_dtype, &o.small);
    o.progress = out.progress;
    Result<synth::SynthResult> r = synth::RunSynth(Env::Default(), o);
    if (!r.ok()) return r.status();
    PrintSummary(o, *r);
    return Status::Ok();
  });
}

}  // namespace k3::prep
