// Test fixtures for the engine: prepared directories of the `k3prep synth --preset tiny|small`
// checkpoints (synth + pack through k3prep's library; k3run itself never links k3prep), and
// helpers to run the model and the CLI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/prepared_manifest.h"
#include "k3run/app/cli.h"
#include "k3run/engine/media.h"
#include "k3run/engine/model.h"
#include "k3run/engine/session.h"
#include "k3run/text/tokenizer.h"
#include "k3run/weights/weights.h"

namespace k3::run::testing {

// The tiny checkpoint (seed 0) and its prepared directory (copy mode), built once per CTest run
// (tests/support/synth_fixture.h) and shared by every test process: never modify them (copy
// first).
const std::string& TinyCheckpointDir();
const std::string& TinyPreparedDir();
// The tiny checkpoint's tokenizer (vocab 1,280), loaded once; a failed load fails the test.
const tok::Tokenizer& TinyTokenizer();
// The small preset (93 layers, 64 experts top-8, vocab 4352, seed 0) packed in copy mode, shared
// the same way.
const std::string& SmallPreparedDir();

// An opened prepared directory plus its RamWeights.
struct Engine {
  prepared::PreparedDir prepared;
  std::unique_ptr<RamWeights> weights;
};
std::unique_ptr<Engine> OpenEngine(const std::string& dir, Env* env = Env::Default(),
                                   RamWeightsOptions options = {});

// Greedy generation through any weight source (an engine over it; layers 0: all), every step's
// logits appended to *logits ([steps][vocab]); *experts_skipped, when given, gets the engine's
// count of skipped (token, expert) pairs.
std::vector<int32_t> GenerateThrough(WeightSource* w, const ModelConfig& c, int layers,
                                     const std::vector<int32_t>& prompt, int64_t gen,
                                     bool recompute, std::vector<float>* logits,
                                     int64_t* experts_skipped = nullptr);
// Generates with every step's logits appended to *logits ([steps][vocab]).
std::vector<int32_t> GenerateLogits(Engine* e, const std::vector<int32_t>& prompt, int64_t gen,
                                    bool recompute, std::vector<float>* logits, int layers = 0);

// PlanOptions for a sequence of `positions` positions whose passes may hold all of them.
PlanOptions ContextPlan(int64_t positions);
// The engine over `dir` planned with `po` and loaded; null, with the test failed, when a step
// fails.
std::unique_ptr<run::Engine> OpenPlanned(const std::string& dir, const PlanOptions& po);

// Runs the k3run CLI in-process. Returns the exit code; stdout chunks (one per write) and the
// stderr text are captured.
struct CliRun {
  int exit_code = -1;
  std::vector<std::string> stdout_writes;
  std::string stdout_text() const;
  std::string stderr_text;
};
CliRun RunCliArgs(const std::vector<std::string>& args, CliIo io = {});
// A CliIo whose stdin gives `lines`, one per read, then end of input (chat tests).
CliIo Stdin(std::vector<std::string> lines);

// Copies the tiny prepared directory to `dst` as a text-only one (k3.json without "vision" or
// vision.bin's regions, resealed: what `k3prep pack --no-vision` writes). Returns `dst`; the
// test fails when it cannot.
// The embedding rows of `tokens` as an image span at position `first`: feeding pads there gives
// the logits of feeding the tokens themselves (what the media tests compare against).
MediaSpan SpanOfTokens(run::Engine* e, const std::vector<int32_t>& tokens, int64_t first);

std::string CopyTinyWithoutVision(const std::string& dst);

// Copies the tiny prepared directory to `dst` and flips one byte of every expert of `layer`,
// so whichever experts routing picks there fail their XXH3-64 under --verify-reads
// (PlanOptions::verify_reads): RUN INVALID. Returns `dst`.
std::string CopyTinyWithCorruptExperts(const std::string& dst, int layer);

// A prompt that exercises the tiny model (ids < 1280).
inline const std::vector<int32_t> kPrompt = {3, 7, 11, 5, 9, 300, 1000, 42};
inline const std::string kPromptText = "3,7,11,5,9,300,1000,42";

}  // namespace k3::run::testing
