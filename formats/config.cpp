// config.json reader: the lookup of MODEL.md §1.2, required/optional keys of §1.4, the rules of
// §1.5 plus DESIGN.md §4 (MXFP4) and our additions; the canonical serialisation.
//
// Every problem is collected before refusing, so one run shows the user everything to fix.
// Rules that need a value are only checked when that value was found and usable, so a missing
// key is reported once (as missing) and never again as "0 must be > 0".
#include "formats/config.h"

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

namespace k3 {
namespace {

using json = nlohmann::json;

// How many offending names or entries a list shows before "... and N more".
constexpr size_t kShown = 32;

std::string JoinKey(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// "a, b, c, ... and 4 more".
std::string ShortList(const std::vector<std::string>& items, size_t total) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  if (total > items.size()) out += ", ... and " + std::to_string(total - items.size()) + " more";
  return out;
}

// A JSON value for a message: scalars as written (bounded), containers by type only.
std::string Brief(const json& v) {
  if (v.is_structured()) return std::string("an ") + v.type_name();
  std::string text = v.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// ------------------------------------------------------------------------------------------
// Parsing. nlohmann keeps the last of two equal keys without a word; a config in which two
// values compete for one key is ambiguous, so the parse callback tracks the keys of every open
// object and records each repeat with its path. Frames hold only their own key or index (never
// a full path), so memory stays linear in the input however deep it nests.
constexpr int kMaxDepth = 100;  // the release nests 5 levels deep

struct TooDeep {};  // thrown from the callback: nlohmann offers no other way to stop a parse

class DuplicateKeyFinder {
 public:
  bool On(int depth, json::parse_event_t event, const json& parsed) {
    if (depth > kMaxDepth) throw TooDeep{};
    switch (event) {
      case json::parse_event_t::object_start: stack_.push_back(Frame{true, {}, {}, 0}); break;
      case json::parse_event_t::array_start: stack_.push_back(Frame{false, {}, {}, 0}); break;
      case json::parse_event_t::key: {
        Frame& f = stack_.back();
        f.last_key = parsed.get<std::string>();
        if (!f.keys.insert(f.last_key).second) {
          if (found_.size() < kShown) found_.push_back(Path());
          ++count_;
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack_.empty()) stack_.pop_back();
        ChildDone();
        break;
      case json::parse_event_t::value: ChildDone(); break;
    }
    return true;  // keep everything: the DOM is only used when no duplicate was found
  }
  const std::vector<std::string>& found() const { return found_; }
  size_t count() const { return count_; }

 private:
  struct Frame {
    bool is_object;
    std::unordered_set<std::string> keys;
    std::string last_key;
    size_t index;  // next element index when !is_object
  };
  void ChildDone() {
    if (!stack_.empty() && !stack_.back().is_object) ++stack_.back().index;
  }
  // "text_config.linear_attn_config.head_dim"; control bytes shown as '?' so a hostile key
  // cannot drive the user's terminal.
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i < stack_.size(); ++i) {
      const Frame& f = stack_[i];
      if (f.is_object) {
        path = JoinKey(path, f.last_key);
      } else {
        path += "[" + std::to_string(f.index) + "]";
      }
    }
    for (char& ch : path) {
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
    }
    return path.size() > 200 ? "..." + path.substr(path.size() - 200) : path;
  }

  std::vector<Frame> stack_;
  std::vector<std::string> found_;
  size_t count_ = 0;
};

struct ParsedJson {
  json root;
  std::vector<std::string> duplicates;  // paths, at most kShown
  size_t duplicate_count = 0;
};

Result<ParsedJson> ParseJson(std::string_view text, const std::string& source) {
  DuplicateKeyFinder finder;
  ParsedJson out;
  try {
    out.root = json::parse(text.begin(), text.end(),
                           [&finder](int depth, json::parse_event_t event, json& parsed) {
                             return finder.On(depth, event, parsed);
                           });
  } catch (const TooDeep&) {
    return Status::Invalid(source + ": JSON nested more than " + std::to_string(kMaxDepth) +
                           " levels deep; a model config nests a few levels (is this the "
                           "checkpoint's config.json?)");
  } catch (const json::parse_error& e) {
    // nlohmann counts bytes from 1 (e.byte is the count read, the offending byte included);
    // the message gives the 0-based offset of that byte, as `cmp` and hex editors do.
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    return Status::Invalid(source + ": not valid JSON at byte offset " + std::to_string(offset) +
                           " (" + e.what() +
                           "); fix the file there, or replace it with the checkpoint's original "
                           "config.json");
  } catch (const json::exception& e) {
    return Status::Invalid(source + ": not usable JSON (" + e.what() + ")");
  }
  out.duplicates = finder.found();
  out.duplicate_count = finder.count();
  return out;
}

// Why a JSON number cannot be an int field (" is not a whole number", ...), empty when it can.
std::string IntProblem(double d) {
  if (!(d > -2147483649.0 && d < 2147483648.0)) return " does not fit a 32-bit integer";
  if (d != std::trunc(d)) return " is not a whole number (integer fields are never truncated)";
  return "";
}

// ------------------------------------------------------------------------------------------
// The lookup of MODEL.md §1.2.
struct Located {
  const json* value = nullptr;
  std::string path;  // "text_config.hidden_size", "hidden_size" (root), ...
};

class ConfigReader {
 public:
  ConfigReader(const json& root, std::vector<std::string>* problems) : problems_(problems) {
    // Shape detection: nested iff the root has "text_config" (whatever its type).
    const json* base = &root;
    const auto tc = root.find("text_config");
    if (tc != root.end()) {
      if (tc->is_object()) {
        text_config_ = &*tc;
        candidates_.push_back({&*tc, "text_config"});
        base = &*tc;
      } else {
        problems->push_back(std::string("text_config: expected an object (the language model's "
                                        "config), found ") + tc->type_name());
        base = nullptr;
      }
    }
    if (base != nullptr) {
      const auto lin = base->find("linear_attn_config");
      const std::string lin_path = JoinKey(base == &root ? "" : "text_config",
                                           "linear_attn_config");
      if (lin != base->end()) {
        if (lin->is_object()) {
          candidates_.push_back({&*lin, lin_path});
        } else {
          problems->push_back(lin_path + ": expected an object (the KDA/MLA layer map), found " +
                              lin->type_name());
        }
      }
    }
    candidates_.push_back({&root, ""});
  }

  const json* text_config() const { return text_config_; }

  Located Find(const char* primary, const char* alias) const {
    for (const Candidate& cand : candidates_) {
      for (const char* name : {primary, alias}) {
        if (name == nullptr) continue;
        const auto it = cand.object->find(name);
        if (it != cand.object->end()) return {&*it, JoinKey(cand.path, name)};
      }
    }
    return {};
  }

  // A required number: a missing key or a non-number is recorded as missing.
  bool Number(const char* primary, const char* alias, double* out, std::string* path) {
    const Located hit = Find(primary, alias);
    if (hit.value == nullptr) {
      missing.push_back(alias ? std::string(primary) + " (or " + alias + ")" : primary);
      return false;
    }
    if (!hit.value->is_number()) {
      missing.push_back(hit.path + ": expected a number, found " + hit.value->type_name());
      return false;
    }
    *out = hit.value->get<double>();
    *path = hit.path;
    return true;
  }

  // Integer fields must hold whole numbers (see config.h: 128.0 is 128, 128.5 is refused rather
  // than truncated); values no int can hold are refused rather than cast (the cast would be
  // undefined behaviour). The upper bounds are CheckRules' job.
  void Int(const char* primary, const char* alias, int* out) {
    double d = 0;
    std::string path;
    if (!Number(primary, alias, &d, &path)) return;
    if (const std::string why = IntProblem(d); !why.empty()) {
      problems_->push_back(path + " = " + Find(primary, alias).value->dump() + why);
      return;
    }
    *out = static_cast<int>(d);
    where_[primary] = path;
  }

  void Float(const char* primary, const char* alias, float* out) {
    double d = 0;
    std::string path;
    if (!Number(primary, alias, &d, &path)) return;
    if (std::fabs(d) > static_cast<double>(FLT_MAX)) {
      problems_->push_back(path + " = " + Find(primary, alias).value->dump() +
                           " is outside the range of a 32-bit float");
      return;
    }
    *out = static_cast<float>(d);
    where_[primary] = path;
  }

  // Optional booleans (MODEL.md §1.4): bool, or number with nonzero = true; else the default.
  bool Bool(const char* primary, bool dflt) const {
    const Located hit = Find(primary, nullptr);
    if (hit.value == nullptr) return dflt;
    if (hit.value->is_boolean()) return hit.value->get<bool>();
    if (hit.value->is_number()) return hit.value->get<double>() != 0.0;
    return dflt;
  }

  void MarkFound(const std::string& primary, const std::string& path) { where_[primary] = path; }
  bool Have(const std::string& primary) const { return where_.count(primary) != 0; }
  const std::string& Path(const std::string& primary) const { return where_.at(primary); }

  std::string SearchOrder() const {
    std::string out;
    for (const Candidate& cand : candidates_) {
      out += (out.empty() ? "" : ", then ") + (cand.path.empty() ? "the root" : cand.path);
    }
    return out;
  }

  std::vector<std::string> missing;

 private:
  struct Candidate {
    const json* object;
    std::string path;
  };
  std::vector<Candidate> candidates_;
  const json* text_config_ = nullptr;
  std::map<std::string, std::string> where_;  // primary key → path it was read from
  std::vector<std::string>* problems_;
};

// ------------------------------------------------------------------------------------------
// The layer map (MODEL.md §1.5 rules 1–3): any failure to read it counts as missing.
void ReadLayerMap(ConfigReader& r, ModelConfig* c, std::vector<std::string>* problems) {
  const Located hit = r.Find("full_attn_layers", nullptr);
  if (hit.value == nullptr) {
    r.missing.push_back("full_attn_layers (one-based MLA layer list; never defaulted: without it "
                        "every layer would silently run as KDA)");
    return;
  }
  if (!hit.value->is_array()) {
    r.missing.push_back(hit.path + ": expected a non-empty array of one-based layer numbers, "
                        "found " + hit.value->type_name());
    return;
  }
  if (hit.value->empty()) {
    r.missing.push_back(hit.path + ": is an empty array; at least one MLA layer is required");
    return;
  }
  bool usable = true;
  if (hit.value->size() > kMaxFullAttnLayers) {
    problems->push_back(hit.path + " has " + std::to_string(hit.value->size()) +
                        " entries; at most " + std::to_string(kMaxFullAttnLayers) +
                        " are supported");
    usable = false;
  }
  std::vector<std::string> bad;
  size_t n_bad = 0;
  std::vector<int> layers;
  for (size_t i = 0; i < hit.value->size(); ++i) {
    const json& e = (*hit.value)[i];
    std::string why;
    if (!e.is_number()) {
      why = std::string("of type ") + e.type_name();
    } else if (const std::string no = IntProblem(e.get<double>()); !no.empty()) {
      why = e.dump() + no;
    } else {
      layers.push_back(static_cast<int>(e.get<double>()));
      continue;
    }
    if (bad.size() < kShown) bad.push_back("[" + std::to_string(i) + "] is " + why);
    ++n_bad;
  }
  if (n_bad != 0) {
    problems->push_back(hit.path + ": every entry must be a whole number (a one-based layer "
                        "index): " +
                        ShortList(bad, n_bad));
    usable = false;
  }
  if (!usable) return;
  c->full_attn_layers = std::move(layers);
  r.MarkFound("full_attn_layers", hit.path);
}

// Token ids: root first, then text_config; -1 when absent (or null, the HF spelling of none).
int64_t ReadTokenId(const json& root, const json* text_config, const char* key,
                    std::vector<std::string>* problems) {
  const std::pair<const json*, const char*> places[] = {{&root, ""}, {text_config, "text_config"}};
  for (const auto& [object, prefix] : places) {
    if (object == nullptr) continue;
    const auto it = object->find(key);
    if (it == object->end() || it->is_null()) continue;
    const std::string path = JoinKey(prefix, key);
    if (it->is_number_unsigned()) {
      if (it->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
        return static_cast<int64_t>(it->get<uint64_t>());
      }
    } else if (it->is_number_integer()) {
      return it->get<int64_t>();
    } else if (it->is_number_float()) {
      const double d = it->get<double>();
      if (d == std::trunc(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
    problems->push_back(path + ": expected an integer token id, found " +
                        (it->is_number() ? it->dump() : std::string(it->type_name())));
    return -1;
  }
  return -1;
}

// DESIGN.md §4: a quantization_config (text_config, else root) means the routed experts are
// MXFP4; its group size, when stated, must be the one MXFP4 defines.
void ReadQuantization(const json& root, const json* text_config, ModelConfig* c,
                      std::vector<std::string>* problems) {
  c->experts_mxfp4 = false;
  c->mxfp4_group_size = kMxfp4GroupSize;
  const std::pair<const json*, const char*> places[] = {{text_config, "text_config"}, {&root, ""}};
  const json* qc = nullptr;
  std::string path;
  for (const auto& [object, prefix] : places) {
    if (object == nullptr) continue;
    const auto it = object->find("quantization_config");
    if (it == object->end() || it->is_null()) continue;
    qc = &*it;
    path = JoinKey(prefix, "quantization_config");
    break;
  }
  if (qc == nullptr) return;
  c->experts_mxfp4 = true;
  if (!qc->is_object()) {
    problems->push_back(path + ": expected an object, found " + qc->type_name());
    return;
  }
  constexpr const char* kFormat = "mxfp4-pack-quantized";
  if (const auto f = qc->find("format"); f != qc->end() && !(f->is_string() && *f == kFormat)) {
    problems->push_back(path + ".format is " + Brief(*f) + ", but k3 reads only \"" + kFormat +
                        "\" routed experts (the release's format)");
  }
  const json* node = qc;
  for (const char* seg : {"config_groups", "group_0", "weights"}) {
    const auto it = node->find(seg);
    if (it == node->end()) return;  // no group size stated: MXFP4's own, 32
    path = JoinKey(path, seg);
    if (!it->is_object()) {
      problems->push_back(path + ": expected an object, found " + it->type_name());
      return;
    }
    node = &*it;
  }
  if (const auto g = node->find("group_size"); g != node->end()) {
    if (!g->is_number() || g->get<double>() != kMxfp4GroupSize) {
      problems->push_back(path + ".group_size is " + Brief(*g) + ", but the MXFP4 group size " +
                          "must be " + std::to_string(kMxfp4GroupSize) +
                          " (one E8M0 scale per 32 elements); k3 reads no other");
    }
  }
  if (const auto b = node->find("num_bits"); b != node->end()) {
    if (!b->is_number() || b->get<double>() != 4) {
      problems->push_back(path + ".num_bits is " + Brief(*b) + ", but MXFP4 elements are 4 bits");
    }
  }
}

void Mxfp4DimProblems(const ModelConfig& c, const std::string& latent_key,
                      const std::string& inter_key, std::vector<std::string>* problems) {
  const int g = c.mxfp4_group_size;
  if (g <= 0) {
    problems->push_back("MXFP4 group size " + std::to_string(g) + " is not positive");
    return;
  }
  const std::pair<const std::string*, int> dims[] = {{&latent_key, c.latent},
                                                     {&inter_key, c.moe_inter}};
  for (const auto& [key, value] : dims) {
    if (key->empty() || value % g == 0) continue;
    problems->push_back(*key + " = " + std::to_string(value) + " is not a multiple of " +
                        std::to_string(g) + ", the MXFP4 group size: the routed experts are "
                        "MXFP4 (quantization_config present, or expert tensors stored as U8), so "
                        "every expert row must hold whole groups; fix the size, or store the "
                        "experts unquantised and drop quantization_config");
  }
}

// The upper bounds of config.h, each checked only when its value was read. Messages name the
// bound and what it protects, so a user who really has such a model knows what to change.
void CheckUpperBounds(const ModelConfig& c, const ConfigReader& r,
                      std::vector<std::string>* problems) {
  struct Bound {
    const char* key;
    int value;
    int max;
  };
  const Bound bounds[] = {
      {"num_hidden_layers", c.n_layers, kMaxLayers},
      {"hidden_size", c.hidden, kMaxWidth},
      {"vocab_size", c.vocab, kMaxVocab},
      {"num_heads", c.kda_heads, kMaxHeads},
      {"head_dim", c.kda_head_dim, kMaxHeadDim},
      {"short_conv_kernel_size", c.conv_k, kMaxConvKernel},
      {"num_attention_heads", c.n_heads, kMaxHeads},
      {"q_lora_rank", c.q_lora, kMaxWidth},
      {"kv_lora_rank", c.kv_lora, kMaxWidth},
      {"qk_nope_head_dim", c.qk_nope, kMaxHeadDim},
      {"qk_rope_head_dim", c.qk_rope, kMaxHeadDim},
      {"v_head_dim", c.v_head, kMaxHeadDim},
      {"num_experts", c.n_experts, kMaxExperts},
      {"num_shared_experts", c.n_shared, kMaxSharedExperts},
      {"routed_expert_hidden_size", c.latent, kMaxWidth},
      {"moe_intermediate_size", c.moe_inter, kMaxWidth},
      {"intermediate_size", c.dense_inter, kMaxDenseInter},
      {"attn_res_block_size", c.attn_res_block, kMaxAttnResBlock},
  };
  for (const Bound& b : bounds) {
    if (r.Have(b.key) && b.value > b.max) {
      problems->push_back(r.Path(b.key) + " = " + std::to_string(b.value) +
                          " exceeds the bound " + std::to_string(b.max) +
                          " (k3's limit, far above the released model; docs/FORMATS.md lists "
                          "every bound): a corrupted or hostile config.json?");
    }
  }
  // The product sizes experts.idx and every per-expert table; each factor alone may be in
  // bounds. Only checked when both factors are (the product then fits 64 bits).
  if (r.Have("num_hidden_layers") && r.Have("first_k_dense_replace") && r.Have("num_experts") &&
      c.n_layers <= kMaxLayers && c.n_experts <= kMaxExperts && c.first_dense >= 0 &&
      c.first_dense <= c.n_layers) {
    const int64_t routed = int64_t{c.n_layers - c.first_dense} * c.n_experts;
    if (routed > kMaxRoutedExperts) {
      problems->push_back("(num_hidden_layers " + std::to_string(c.n_layers) +
                          " - first_k_dense_replace " + std::to_string(c.first_dense) +
                          ") x num_experts " + std::to_string(c.n_experts) + " = " +
                          std::to_string(routed) + " routed experts exceeds the bound " +
                          std::to_string(kMaxRoutedExperts) +
                          " (k3's limit, far above the released model's 82,432)");
    }
  }
}

// The rules of MODEL.md §1.5 (4–10) and ours; each checked only when its inputs were read.
void CheckRules(const ModelConfig& c, const ConfigReader& r, std::vector<std::string>* problems) {
  auto at = [&r](const char* key) { return r.Path(key); };
  for (const auto& [key, value] : {std::pair<const char*, int>{"num_hidden_layers", c.n_layers},
                                   {"hidden_size", c.hidden}, {"vocab_size", c.vocab}}) {
    if (r.Have(key) && value <= 0) {
      problems->push_back(at(key) + " = " + std::to_string(value) + " must be > 0");
    }
  }
  if (r.Have("full_attn_layers")) {
    const std::vector<int>& fal = c.full_attn_layers;
    const std::string path = at("full_attn_layers");
    if (r.Have("num_hidden_layers") && c.n_layers > 0) {
      if (fal.size() >= static_cast<size_t>(c.n_layers)) {
        problems->push_back(path + " lists " + std::to_string(fal.size()) +
                            " layers but num_hidden_layers is " + std::to_string(c.n_layers) +
                            ": at least one layer must remain KDA (needs length < layers)");
      }
      std::vector<std::string> bad;
      size_t n_bad = 0;
      for (size_t i = 0; i < fal.size(); ++i) {
        if (fal[i] >= 1 && fal[i] <= c.n_layers) continue;
        if (bad.size() < kShown) bad.push_back("[" + std::to_string(i) + "] = " +
                                               std::to_string(fal[i]));
        ++n_bad;
      }
      if (n_bad != 0) {
        problems->push_back(path + " has entries outside 1.." + std::to_string(c.n_layers) +
                            " (the list is ONE-based: layer 1 is the first layer): " +
                            ShortList(bad, n_bad));
      }
    }
    std::set<int> seen;
    std::set<int> repeated;
    for (int layer : fal) {
      if (!seen.insert(layer).second) repeated.insert(layer);
    }
    if (!repeated.empty()) {
      std::vector<std::string> names;
      for (int layer : repeated) names.push_back(std::to_string(layer));
      problems->push_back(path + " lists layer(s) " + ShortList(names, names.size()) +
                          " more than once");
    }
  }
  if (r.Have("num_experts_per_token")) {
    const std::string k = at("num_experts_per_token") + " = " + std::to_string(c.topk);
    if (c.topk < 1) problems->push_back(k + ": top-k must be at least 1 (every token is routed)");
    if (c.topk > kMaxTopK) {
      problems->push_back(k + " exceeds " + std::to_string(kMaxTopK) +
                          ", the most the engine's fixed routing arrays hold");
    }
    if (r.Have("num_experts") && c.topk > c.n_experts) {
      problems->push_back(k + " exceeds num_experts = " + std::to_string(c.n_experts));
    }
  }
  if (r.Have("attn_res_block_size") && c.attn_res_block <= 0) {
    problems->push_back(at("attn_res_block_size") + " = " + std::to_string(c.attn_res_block) +
                        " must be > 0 (AttnRes boundaries are layer % block_size == 0)");
  }
  if (r.Have("short_conv_kernel_size") && c.conv_k < 1) {
    problems->push_back(at("short_conv_kernel_size") + " = " + std::to_string(c.conv_k) +
                        " must be >= 1 (the causal convolution needs a tap)");
  }
  if (r.Have("first_k_dense_replace") && r.Have("num_hidden_layers") &&
      (c.first_dense < 0 || c.first_dense > c.n_layers)) {
    problems->push_back(at("first_k_dense_replace") + " = " + std::to_string(c.first_dense) +
                        " must be in 0..num_hidden_layers (" + std::to_string(c.n_layers) + ")");
  }
  // Sizes of tensors: zero would describe an empty projection, which no checkpoint has.
  // num_shared_experts may be 0 (no shared experts is a coherent model).
  const std::pair<const char*, int> sizes[] = {
      {"num_heads", c.kda_heads},          {"head_dim", c.kda_head_dim},
      {"num_attention_heads", c.n_heads},  {"q_lora_rank", c.q_lora},
      {"kv_lora_rank", c.kv_lora},         {"qk_nope_head_dim", c.qk_nope},
      {"qk_rope_head_dim", c.qk_rope},     {"v_head_dim", c.v_head},
      {"num_experts", c.n_experts},        {"routed_expert_hidden_size", c.latent},
      {"moe_intermediate_size", c.moe_inter}, {"intermediate_size", c.dense_inter}};
  for (const auto& [key, value] : sizes) {
    if (r.Have(key) && value <= 0) {
      problems->push_back(at(key) + " = " + std::to_string(value) + " must be > 0 (it sizes "
                          "weight tensors)");
    }
  }
  if (r.Have("num_shared_experts") && c.n_shared < 0) {
    problems->push_back(at("num_shared_experts") + " = " + std::to_string(c.n_shared) +
                        " must be >= 0");
  }
  CheckUpperBounds(c, r, problems);
  const std::pair<const char*, float> positive[] = {
      {"activation_situ_beta", c.situ_b1}, {"activation_situ_linear_beta", c.situ_b2},
      {"rms_norm_eps", c.rms_eps}, {"routed_scaling_factor", c.routed_scale}};
  for (const auto& [key, value] : positive) {
    if (r.Have(key) && !(value > 0)) {
      char buf[32];
      const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;
      problems->push_back(at(key) + " = " + std::string(buf, end) + " must be > 0");
    }
  }
}

std::string Refusal(const std::string& source, const ConfigReader& r,
                    const std::vector<std::string>& problems) {
  std::vector<std::string> all;
  if (!r.missing.empty()) {
    std::string m = std::to_string(r.missing.size()) +
                    " required key(s) missing or not a number (searched " + r.SearchOrder() +
                    "; primary name, then alias; required keys are never defaulted):";
    const size_t shown = std::min(r.missing.size(), kShown);
    for (size_t i = 0; i < shown; ++i) m += "\n      " + r.missing[i];
    if (r.missing.size() > shown) {
      m += "\n      ... and " + std::to_string(r.missing.size() - shown) + " more";
    }
    all.push_back(std::move(m));
  }
  all.insert(all.end(), problems.begin(), problems.end());
  std::string out = source + ": model config refused, " + std::to_string(all.size()) +
                    " problem(s); fix them (spec/MODEL.md §1 lists every key and rule):";
  for (const std::string& p : all) out += "\n  - " + p;
  return out;
}

}  // namespace

bool ModelConfig::is_mla(int L) const {
  const int64_t one_based = static_cast<int64_t>(L) + 1;
  return std::find(full_attn_layers.begin(), full_attn_layers.end(), one_based) !=
         full_attn_layers.end();
}

Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source) {
  K3_ASSIGN_OR_RETURN(ParsedJson parsed, ParseJson(json_text, source));
  const json& root = parsed.root;
  if (!root.is_object()) {
    return Status::Invalid(source + ": the top level is a JSON " + root.type_name() +
                           ", but a model config must be a JSON object ({...}); is this the "
                           "checkpoint's config.json?");
  }
  std::vector<std::string> problems;
  if (parsed.duplicate_count != 0) {
    problems.push_back("duplicate JSON key(s), so which value applies is ambiguous: " +
                       ShortList(parsed.duplicates, parsed.duplicate_count));
  }
  ConfigReader r(root, &problems);
  ModelConfig c;
  // MODEL.md §1.3 order, so the missing list reads like the table.
  r.Int("hidden_size", nullptr, &c.hidden);
  r.Int("num_hidden_layers", nullptr, &c.n_layers);
  r.Int("vocab_size", nullptr, &c.vocab);
  r.Float("rms_norm_eps", nullptr, &c.rms_eps);
  r.Int("num_heads", "kda_num_heads", &c.kda_heads);
  r.Int("head_dim", "kda_head_dim", &c.kda_head_dim);
  r.Int("short_conv_kernel_size", nullptr, &c.conv_k);
  r.Float("gate_lower_bound", nullptr, &c.gate_lb);
  r.Int("num_attention_heads", nullptr, &c.n_heads);
  r.Int("q_lora_rank", nullptr, &c.q_lora);
  r.Int("kv_lora_rank", nullptr, &c.kv_lora);
  r.Int("qk_nope_head_dim", nullptr, &c.qk_nope);
  r.Int("qk_rope_head_dim", nullptr, &c.qk_rope);
  r.Int("v_head_dim", nullptr, &c.v_head);
  c.mla_out_gate = r.Bool("mla_use_output_gate", true);
  r.Int("num_experts", nullptr, &c.n_experts);
  r.Int("num_experts_per_token", nullptr, &c.topk);
  r.Int("num_shared_experts", nullptr, &c.n_shared);
  r.Int("routed_expert_hidden_size", nullptr, &c.latent);
  r.Int("moe_intermediate_size", nullptr, &c.moe_inter);
  r.Float("routed_scaling_factor", nullptr, &c.routed_scale);
  c.moe_renorm = r.Bool("moe_renormalize", true);
  c.latent_norm = r.Bool("latent_moe_use_norm", true);
  r.Int("first_k_dense_replace", nullptr, &c.first_dense);
  r.Int("intermediate_size", nullptr, &c.dense_inter);
  r.Int("attn_res_block_size", nullptr, &c.attn_res_block);
  r.Float("activation_situ_beta", "situ_beta", &c.situ_b1);
  r.Float("activation_situ_linear_beta", "situ_linear_beta", &c.situ_b2);
  ReadLayerMap(r, &c, &problems);

  c.bos_token_id = ReadTokenId(root, r.text_config(), "bos_token_id", &problems);
  c.eos_token_id = ReadTokenId(root, r.text_config(), "eos_token_id", &problems);
  c.pad_token_id = ReadTokenId(root, r.text_config(), "pad_token_id", &problems);
  c.media_placeholder_token_id =
      ReadTokenId(root, r.text_config(), "media_placeholder_token_id", &problems);
  ReadQuantization(root, r.text_config(), &c, &problems);

  CheckRules(c, r, &problems);
  if (c.experts_mxfp4) {
    Mxfp4DimProblems(c, r.Have("routed_expert_hidden_size") ? r.Path("routed_expert_hidden_size") : "",
                     r.Have("moe_intermediate_size") ? r.Path("moe_intermediate_size") : "",
                     &problems);
  }
  if (!r.missing.empty() || !problems.empty()) {
    return Status::Invalid(Refusal(source, r, problems));
  }
  return c;
}

Result<ModelConfig> LoadModelConfig(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, kMaxConfigBytes));
  return ParseModelConfig(text, path);
}

Status ValidateMxfp4Dims(const ModelConfig& c, const std::string& source) {
  std::vector<std::string> problems;
  Mxfp4DimProblems(c, "routed_expert_hidden_size", "moe_intermediate_size", &problems);
  if (problems.empty()) return Status::Ok();
  std::string msg = source + ": model config does not fit MXFP4 experts:";
  for (const std::string& p : problems) msg += "\n  - " + p;
  return Status::Invalid(std::move(msg));
}

double JsonNumberForFloat(float f) {
  if (!std::isfinite(f)) return f;
  char buf[64];
  double d = 0;
  // Shortest float digits usually survive the reader's double-then-float path; when they do
  // not (a decimal near a rounding midpoint), 9 significant digits always do.
  auto end = std::to_chars(buf, buf + sizeof buf, f).ptr;
  std::from_chars(buf, end, d);
  if (static_cast<float>(d) == f) return d;
  end = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::general, 9).ptr;
  std::from_chars(buf, end, d);
  return d;
}

std::string CanonicalConfigJson(const ModelConfig& c) {
  // nlohmann::json objects are std::maps: keys come out sorted, so equal configs give equal
  // bytes. Key names are the primary JSON keys of MODEL.md §1.3.
  json j = json::object();
  j["activation_situ_beta"] = JsonNumberForFloat(c.situ_b1);
  j["activation_situ_linear_beta"] = JsonNumberForFloat(c.situ_b2);
  j["attn_res_block_size"] = c.attn_res_block;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["experts_mxfp4"] = c.experts_mxfp4;
  j["first_k_dense_replace"] = c.first_dense;
  j["full_attn_layers"] = c.full_attn_layers;
  j["gate_lower_bound"] = JsonNumberForFloat(c.gate_lb);
  j["head_dim"] = c.kda_head_dim;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.dense_inter;
  j["kv_lora_rank"] = c.kv_lora;
  j["latent_moe_use_norm"] = c.latent_norm;
  j["media_placeholder_token_id"] = c.media_placeholder_token_id;
  j["mla_use_output_gate"] = c.mla_out_gate;
  j["moe_intermediate_size"] = c.moe_inter;
  j["moe_renormalize"] = c.moe_renorm;
  j["mxfp4_group_size"] = c.mxfp4_group_size;
  j["num_attention_heads"] = c.n_heads;
  j["num_experts"] = c.n_experts;
  j["num_experts_per_token"] = c.topk;
  j["num_heads"] = c.kda_heads;
  j["num_hidden_layers"] = c.n_layers;
  j["num_shared_experts"] = c.n_shared;
  j["pad_token_id"] = c.pad_token_id;
  j["q_lora_rank"] = c.q_lora;
  j["qk_nope_head_dim"] = c.qk_nope;
  j["qk_rope_head_dim"] = c.qk_rope;
  j["rms_norm_eps"] = JsonNumberForFloat(c.rms_eps);
  j["routed_expert_hidden_size"] = c.latent;
  j["routed_scaling_factor"] = JsonNumberForFloat(c.routed_scale);
  j["short_conv_kernel_size"] = c.conv_k;
  j["v_head_dim"] = c.v_head;
  j["vocab_size"] = c.vocab;
  return j.dump();
}

}  // namespace k3
