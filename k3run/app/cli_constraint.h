// The CLI's constrained decoding (docs/TOOLS.md): `--grammar FILE` (GBNF) and `--json-schema
// FILE` for prompt runs and --batch, and in --chat `--json-schema FILE`, `--tools FILE` (an
// OpenAI `tools` array) with `--tool-choice auto|none|required|NAME`.
//
// Prompt runs: the grammar covers the generated text; once it is complete the model's end tokens
// are allowed (and end the run unless --ignore-eos). Chat: the same request fields as the server
// (serve/openai_tools.h, serve/structured_output.h), so a chat turn is rendered and constrained
// exactly as the same request over HTTP. Every file and its contents are checked before the
// weights load: exit 2 naming the flag, the file and what is wrong.
// Thread safety: a loaded CliConstraint is immutable; MakeConstraint may run on any thread.
#pragma once

#include <memory>
#include <string>

#include "common/env.h"
#include "common/status.h"
#include "k3run/app/cli.h"
#include "k3run/engine/grammar_constraint.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

struct CliConstraint {
  std::unique_ptr<GrammarLibrary> library;  // null: no constraint
  std::string gbnf;                         // "" for a chat whose turns are unconstrained
  std::string source;                       // "--grammar FILE", for messages
  // Chat: what the template renders (tools, tool_choice, response_format), and whether
  // replies are parsed for tool calls.
  TemplateOptions tmpl;
  bool tools = false;

  // A fresh constraint (its own state) for one sequence or turn; null when there is none.
  Result<std::shared_ptr<TokenConstraint>> Make() const;
};

// True when `o` gives any of --grammar, --json-schema, --tools, --tool-choice.
bool AnyConstraintFlag(const RunOptions& o);

// Reads and checks the files `o` names (none: an empty CliConstraint). `tok` may be null only
// when no constraint flag is given.
Result<CliConstraint> LoadCliConstraint(Env* env, const tok::Tokenizer* tok, const RunOptions& o);

}  // namespace k3::run
