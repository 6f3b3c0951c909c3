#include "k3verify/cli.h"

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/env.h"
#include "k3verify/verify_prepared.h"
#include "k3verify/verify_shards.h"
#include "k3verify/verify_tensors.h"

namespace k3::verify {
namespace {

void WriteStdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

Status RunShards(const ShardsOptions& options, const OutputOptions& out) {
  K3_ASSIGN_OR_RETURN(ShardsReport report, VerifyShards(Env::Default(), options));
  WriteStdout(out.json ? RenderShardsJson(report) : RenderShardsText(report));
  return report.Verdict();
}

Status RunPrepared(const PreparedOptions& options, const OutputOptions& out) {
  K3_ASSIGN_OR_RETURN(PreparedReport report, VerifyPrepared(Env::Default(), options));
  WriteStdout(out.json ? RenderPreparedJson(report) : RenderPreparedText(report));
  return report.Verdict();
}

Status RunTensors(const TensorsOptions& options, const OutputOptions& out) {
  K3_ASSIGN_OR_RETURN(TensorsReport report, VerifyTensors(Env::Default(), options));
  WriteStdout(out.json ? RenderTensorsJson(report) : RenderTensorsText(report));
  return report.Verdict();
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app("k3verify: audit K3 checkpoints and prepared directories", "k3verify");
  app.set_version_flag("--version", "k3verify 0.1.0");
  app.require_subcommand(1);
  app.fallthrough();  // --quiet, --progress, --json also after the subcommand
  OutputOptions out;
  AddOutputFlags(&app, &out);
  AddJsonFlag(&app, &out);

  ShardsOptions shards;
  CLI::App* cmd = app.add_subcommand(
      "shards", "check every shard's structure, config.json, the index, and SHA-256 against "
                "the download manifest (k3-download.json) or print the hashes");
  cmd->add_option("MODEL_DIR", shards.model_dir, "checkpoint directory")->required();
  cmd->add_option("--manifest", shards.manifest,
                  "download manifest (default: MODEL_DIR/k3-download.json when present)");
  cmd->add_option("--jobs", shards.jobs, "files hashed at once (default: number of cores)")
      ->check(InRange(1, 256));

  PreparedOptions prepared;
  CLI::App* pcmd = app.add_subcommand(
      "prepared", "check a prepared directory: k3.sum, k3.json, every file's size, experts.idx; "
                  "--deep re-hashes every region and expert; --against compares every packed "
                  "byte with the checkpoint");
  pcmd->add_option("PREPARED", prepared.dir, "prepared directory (k3prep pack --out)")->required();
  pcmd->add_flag("--deep", prepared.deep,
                 "re-hash every region (XXH3-128) and every expert (XXH3-64)");
  pcmd->add_option("--against", prepared.against,
                   "checkpoint directory to byte-compare every packed region and expert with");
  pcmd->add_option("--model-dir", prepared.model_dir,
                   "link mode: where the source shards are now (default: k3.json's model_dir)");
  pcmd->add_option("--jobs", prepared.jobs, "files read at once (default: number of cores)")
      ->check(InRange(1, 256));

  TensorsOptions tensors;
  CLI::App* tcmd = app.add_subcommand(
      "tensors", "check named tensors (dtype, shape, XXH3-128, sample bit patterns) of a "
                 "checkpoint or prepared directory against a fixture file, or record one");
  tcmd->add_option("DIR", tensors.dir, "checkpoint or prepared directory")->required();
  auto* fx = tcmd->add_option("--fixtures", tensors.fixtures, "tensor fixture file to check");
  auto* em = tcmd->add_option("--emit", tensors.emit, "write a tensor fixture file");
  fx->excludes(em);
  em->excludes(fx);
  tcmd->add_option("--names", tensors.names,
                   "only tensors whose name matches one of these regexes (searched anywhere in "
                   "the name; anchor with ^...$)");
  tcmd->add_option("--model-dir", tensors.model_dir,
                   "prepared link mode: where the source shards are now");
  tcmd->add_option("--jobs", tensors.jobs, "tensors read at once (default: number of cores)")
      ->check(InRange(1, 256));

  return RunCli(app, argc, argv, [&]() -> Status {
    shards.progress = out.progress;
    prepared.progress = out.progress;
    tensors.progress = out.progress;
    if (cmd->parsed()) return RunShards(shards, out);
    if (pcmd->parsed()) return RunPrepared(prepared, out);
    if (tcmd->parsed()) return RunTensors(tensors, out);
    return Status::Invalid("no subcommand (run with --help)");
  });
}

}  // namespace k3::verify
