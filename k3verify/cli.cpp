#include "k3verify/cli.h"

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/env.h"
#include "k3verify/verify_shards.h"

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
      ->check(CLI::Range(1, 256));

  return RunCli(app, argc, argv, [&]() -> Status {
    shards.progress = out.progress;
    if (cmd->parsed()) return RunShards(shards, out);
    return Status::Invalid("no subcommand (run with --help)");
  });
}

}  // namespace k3::verify
