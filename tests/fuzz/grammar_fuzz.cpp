// Fuzz target for the grammar engine (k3run/grammar/): Grammar::Parse on any text never crashes
// and refuses only with kInvalid, and a grammar it accepts can be walked byte by byte; input that
// is JSON goes through the JSON Schema compiler, which refuses only with kInvalid, and whatever
// GBNF it produces must parse (the compiler never writes a grammar the parser refuses). A
// violated property aborts, which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3run/grammar/grammar.h"
#include "k3run/grammar/json_schema.h"
#include "k3run/grammar/matcher.h"

namespace {

using k3::run::grammar::Grammar;

const std::vector<std::string>& Specials() {
  static const std::vector<std::string> names = {"<|open|>", "<|close|>", "<|sep|>", "[EOS]",
                                                 "<|end_of_msg|>"};
  return names;
}

void Walk(const std::shared_ptr<const Grammar>& g, std::string_view bytes) {
  k3::run::grammar::Matcher m(g);
  for (char c : bytes.substr(0, 256)) {
    if (!m.AcceptByte(static_cast<uint8_t>(c))) break;
  }
  (void)m.CanEnd();
  (void)m.StateKey();
}

void Schema(const nlohmann::json& schema, std::string_view text) {
  using k3::run::grammar::SchemaForm;
  for (SchemaForm form : {SchemaForm::kJsonText, SchemaForm::kXtmlArguments}) {
    k3::Result<std::string> gbnf = k3::run::grammar::JsonSchemaToGbnf(schema, form);
    if (!gbnf.ok()) {
      if (gbnf.status().code() != k3::Code::kInvalid) std::abort();
      continue;
    }
    k3::Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(*gbnf, Specials(), "schema");
    if (!g.ok()) std::abort();  // the compiler wrote a grammar the parser refuses
    Walk(*g, text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  k3::Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(text, Specials(), "fuzz.gbnf");
  if (g.ok()) {
    Walk(*g, text);
  } else if (g.status().code() != k3::Code::kInvalid) {
    std::abort();
  }
  const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!schema.is_discarded()) Schema(schema, text);
  return 0;
}
