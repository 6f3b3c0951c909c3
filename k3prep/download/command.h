// `k3prep download REPO --dest DIR [...]`: the CLI11 subcommand over RunDownload
// (k3prep/download/download.h). Flags, the token's sources and HF_ENDPOINT; no download logic.
//
// Token precedence: --token-file F, then $HF_TOKEN, then the file $HF_TOKEN_PATH, then
// $HF_HOME/token (default ~/.cache/huggingface/token) when it exists. The token is never
// printed; a token file holding control characters is refused without echoing it.
#pragma once

#include <CLI/CLI.hpp>

#include "common/cli_common.h"
#include "common/env.h"
#include "common/status.h"

namespace k3::prep {

// Registers the `download` subcommand on `app` and returns it (flags per DESIGN.md §6).
CLI::App* AddDownloadCommand(CLI::App* app, const OutputOptions* out);

// Runs the download when `cmd` (the value AddDownloadCommand returned) was parsed.
Status RunDownloadCommand(CLI::App* cmd);

// The token from the sources above ("" when there is none); `source` says where it came from
// (for messages: never the token itself).
Result<std::string> LoadHubToken(Env* env, const std::string& token_file, std::string* source);

}  // namespace k3::prep
