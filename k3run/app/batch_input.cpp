#include "k3run/app/batch_input.h"

#include <nlohmann/json.hpp>

#include "k3run/stream/memory_plan.h"

namespace k3::run {
namespace {

using nlohmann::json;

// "FILE:LINE: " + what: every refusal names where it is.
Status Bad(const std::string& name, int64_t line, const std::string& what) {
  return Status::Invalid(name + ":" + std::to_string(line) + ": " + what);
}

bool Blank(std::string_view s) {
  return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

// The ids of `key` ("ids", "spec_oracle").
Result<std::vector<int32_t>> ParseIds(const json& ids, const std::string& name, int64_t line,
                                      int64_t vocab, const std::string& key = "ids") {
  const std::string k = "\"" + key + "\"";
  if (!ids.is_array()) return Bad(name, line, k + " must be an array of token ids");
  if (ids.empty()) return Bad(name, line, k + " is empty: give at least one token id");
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& v = ids[i];
    // is_number_integer excludes 1.0 and true: an id is written as an integer.
    if (!v.is_number_integer()) {
      return Bad(name, line, k + " item " + std::to_string(i + 1) + " (" + v.dump() +
                                 ") is not an integer token id");
    }
    const bool negative = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
    if (negative || v.get<uint64_t>() >= static_cast<uint64_t>(vocab)) {
      return Bad(name, line, k + " item " + std::to_string(i + 1) + " (" + v.dump() +
                                 ") is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return out;
}

Result<int64_t> ParseGen(const json& gen, const std::string& name, int64_t line) {
  if (!gen.is_number_integer()) return Bad(name, line, "\"gen\" must be an integer >= 0");
  if (!gen.is_number_unsigned() && gen.get<int64_t>() < 0) {
    return Bad(name, line, "\"gen\" is " + gen.dump() + ": must be >= 0");
  }
  if (gen.get<uint64_t>() > static_cast<uint64_t>(kMaxPositions)) {
    return Bad(name, line, "\"gen\" is " + gen.dump() + ": the limit is " +
                               std::to_string(kMaxPositions) + " positions");
  }
  return gen.get<int64_t>();
}

Result<BatchInput> ParseLine(std::string_view text, const std::string& name, int64_t line,
                             const tok::Tokenizer* tokenizer, int64_t vocab, int64_t default_gen) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(name, line, "not valid JSON (one object per line)");
  if (!j.is_object()) return Bad(name, line, "each line must be a JSON object, not " +
                                                 std::string(j.type_name()));
  for (const auto& [key, value] : j.items()) {
    if (key != "prompt" && key != "ids" && key != "gen" && key != "spec_oracle" &&
        key != "images") {
      return Bad(name, line, "unknown key \"" + key + "\" (the keys are \"prompt\" or \"ids\", "
                             "and optionally \"gen\", \"images\" and \"spec_oracle\")");
    }
  }
  const bool has_prompt = j.contains("prompt"), has_ids = j.contains("ids");
  if (has_prompt == has_ids) {
    return Bad(name, line, has_prompt ? "both \"prompt\" and \"ids\": give exactly one"
                                      : "neither \"prompt\" nor \"ids\": give exactly one");
  }
  BatchInput in;
  in.line = line;
  in.gen = default_gen;
  if (has_ids) {
    K3_ASSIGN_OR_RETURN(in.ids, ParseIds(j["ids"], name, line, vocab));
  } else {
    if (!j["prompt"].is_string()) return Bad(name, line, "\"prompt\" must be a string");
    if (tokenizer == nullptr) {
      return Bad(name, line, "\"prompt\" needs a tokenizer and the prepared directory has none: "
                             "give \"ids\"");
    }
    if (j.contains("images")) {
      const json& images = j["images"];
      if (!images.is_array() || images.empty()) {
        return Bad(name, line, "\"images\" must be a non-empty array of file paths");
      }
      for (const json& path : images) {
        if (!path.is_string() || path.get<std::string>().empty()) {
          return Bad(name, line, "\"images\" must be a non-empty array of file paths");
        }
        in.images.push_back(path.get<std::string>());
      }
      in.text = j["prompt"].get<std::string>();  // rendered with its images (ResolveBatchImages)
    } else {
      in.ids = tokenizer->Encode(j["prompt"].get<std::string>(), /*allow_special=*/true);
      if (in.ids.empty()) return Bad(name, line, "the prompt is empty (0 ids); give some text");
    }
  }
  if (has_ids && j.contains("images")) {
    return Bad(name, line, "\"images\" needs \"prompt\" (ids cannot say where an image goes)");
  }
  if (j.contains("gen")) {
    K3_ASSIGN_OR_RETURN(in.gen, ParseGen(j["gen"], name, line));
  }
  if (j.contains("spec_oracle")) {
    K3_ASSIGN_OR_RETURN(in.spec_oracle, ParseIds(j["spec_oracle"], name, line, vocab,
                                                 "spec_oracle"));
  }
  const auto P = static_cast<int64_t>(in.ids.size());
  if (P > kMaxPositions || in.gen > kMaxPositions - P) {
    return Bad(name, line, "a prompt of " + std::to_string(P) + " ids and gen " +
                               std::to_string(in.gen) + " need more than the " +
                               std::to_string(kMaxPositions) + " positions a sequence may hold");
  }
  return in;
}

}  // namespace

Result<std::vector<BatchInput>> ParseBatchInputs(std::string_view text, const std::string& name,
                                                 const tok::Tokenizer* tokenizer, int64_t vocab,
                                                 int64_t default_gen) {
  std::vector<BatchInput> inputs;
  int64_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view s = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
    if (Blank(s)) continue;
    K3_ASSIGN_OR_RETURN(BatchInput in, ParseLine(s, name, line, tokenizer, vocab, default_gen));
    inputs.push_back(std::move(in));
  }
  if (inputs.empty()) {
    return Status::Invalid(name + ": no requests (one JSON object per line, e.g. "
                                  "{\"prompt\": \"Hello\"} or {\"ids\": [1, 2, 3]})");
  }
  return inputs;
}

}  // namespace k3::run
