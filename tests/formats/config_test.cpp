// Tests for formats/config: the released and flat fixtures resolve to the values of
// spec/MODEL.md §1.3 (written out here by hand), the lookup order and aliases of §1.2, one test
// per refusal rule (§1.5, DESIGN.md §4, ours) asserting the message names the file and the key,
// and the two writers (canonical JSON, released shape).
#include "formats/config.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace k3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ojson = nlohmann::ordered_json;

constexpr const char* kSource = "fixtures/config.json";

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/tests/data/config/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return std::string(std::istreambuf_iterator<char>(in), {});
}
ojson Released() { return ojson::parse(ReadFixture("released_config.json")); }
ojson Flat() { return ojson::parse(ReadFixture("flat.json")); }

Result<ModelConfig> Parse(const ojson& j) { return ParseModelConfig(j.dump(2), kSource); }

// The refusal message for a config that must be refused as invalid input.
std::string Refusal(const std::string& text) {
  Result<ModelConfig> r = ParseModelConfig(text, kSource);
  EXPECT_FALSE(r.ok()) << "config was accepted";
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalid) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(kSource));
  return r.status().message();
}
std::string Refusal(const ojson& j) { return Refusal(j.dump(2)); }
std::string Refusal(const char* text) { return Refusal(std::string(text)); }

ojson& TextConfig(ojson& j) { return j["text_config"]; }
ojson& LinearAttn(ojson& j) { return j["text_config"]["linear_attn_config"]; }

// ---------------------------------------------------------------- the two fixtures ----------

TEST(ConfigReader, ReleasedConfigResolvesToModelMdValues) {
  Result<ModelConfig> r = Parse(Released());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.hidden, 7168);
  EXPECT_EQ(c.n_layers, 93);
  EXPECT_EQ(c.vocab, 163840);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.kda_heads, 96);
  EXPECT_EQ(c.kda_head_dim, 128);
  EXPECT_EQ(c.conv_k, 4);
  EXPECT_EQ(c.gate_lb, -5.0f);
  EXPECT_EQ(c.n_heads, 96);
  EXPECT_EQ(c.q_lora, 1536);
  EXPECT_EQ(c.kv_lora, 512);
  EXPECT_EQ(c.qk_nope, 128);
  EXPECT_EQ(c.qk_rope, 64);
  EXPECT_EQ(c.v_head, 128);
  EXPECT_TRUE(c.mla_out_gate);
  EXPECT_EQ(c.n_experts, 896);
  EXPECT_EQ(c.topk, 16);
  EXPECT_EQ(c.n_shared, 2);
  EXPECT_EQ(c.latent, 3584);
  EXPECT_EQ(c.moe_inter, 3072);
  EXPECT_EQ(c.routed_scale, 1.0f);
  EXPECT_TRUE(c.moe_renorm);
  EXPECT_TRUE(c.latent_norm);
  EXPECT_EQ(c.first_dense, 1);
  EXPECT_EQ(c.dense_inter, 33792);
  EXPECT_EQ(c.attn_res_block, 12);
  EXPECT_EQ(c.situ_b1, 4.0f);
  EXPECT_EQ(c.situ_b2, 25.0f);
  EXPECT_EQ(c.full_attn_layers, (std::vector<int>{4,  8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48,
                                                  52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 93}));
  EXPECT_TRUE(c.experts_mxfp4);
  EXPECT_EQ(c.mxfp4_group_size, 32);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_EQ(c.eos_token_id, 163586);
  EXPECT_EQ(c.pad_token_id, 163839);
  EXPECT_EQ(c.media_placeholder_token_id, 163605);
}

TEST(ConfigReader, ReleasedLayerTypesAreZeroBased) {
  Result<ModelConfig> r = Parse(Released());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int> mla;
  for (int L = 0; L < r->n_layers; ++L) {
    if (r->is_mla(L)) mla.push_back(L);
  }
  EXPECT_EQ(mla, (std::vector<int>{3,  7,  11, 15, 19, 23, 27, 31, 35, 39, 43, 47,
                                   51, 55, 59, 63, 67, 71, 75, 79, 83, 87, 91, 92}));
  EXPECT_TRUE(r->is_kda(0));
  EXPECT_TRUE(r->is_dense(0));
  EXPECT_FALSE(r->is_dense(1));
  EXPECT_EQ(r->n_moe_layers(), 92);
  std::vector<int> boundaries;
  for (int L = 0; L < r->n_layers; ++L) {
    if (r->is_boundary(L)) boundaries.push_back(L);
  }
  EXPECT_EQ(boundaries, (std::vector<int>{0, 12, 24, 36, 48, 60, 72, 84}));
}

TEST(ConfigReader, FlatFixtureResolvesToTinyValues) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.hidden, 128);
  EXPECT_EQ(c.n_layers, 13);
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(c.kda_heads, 4);       // alias kda_num_heads
  EXPECT_EQ(c.kda_head_dim, 16);   // alias kda_head_dim
  EXPECT_EQ(c.situ_b1, 4.0f);      // alias situ_beta
  EXPECT_EQ(c.situ_b2, 25.0f);     // alias situ_linear_beta
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.q_lora, 64);
  EXPECT_EQ(c.kv_lora, 32);
  EXPECT_EQ(c.qk_nope, 24);
  EXPECT_EQ(c.qk_rope, 8);
  EXPECT_EQ(c.v_head, 16);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.topk, 2);
  EXPECT_EQ(c.latent, 64);
  EXPECT_EQ(c.moe_inter, 48);  // valid: the experts are not MXFP4
  EXPECT_EQ(c.dense_inter, 96);
  EXPECT_EQ(c.attn_res_block, 3);
  EXPECT_EQ(c.full_attn_layers, (std::vector<int>{4, 8, 12, 13}));
  EXPECT_FALSE(c.experts_mxfp4);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.media_placeholder_token_id, -1);
  std::vector<int> mla;
  for (int L = 0; L < c.n_layers; ++L) {
    if (c.is_mla(L)) mla.push_back(L);
  }
  EXPECT_EQ(mla, (std::vector<int>{3, 7, 11, 12}));
}

TEST(ConfigReader, LoadsFromFileThroughEnv) {
  const std::string path = std::string(K3_SOURCE_DIR) + "/tests/data/config/released_config.json";
  Result<ModelConfig> r = LoadModelConfig(Env::Default(), path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hidden, 7168);
}

TEST(ConfigReader, MissingFileNamesThePath) {
  const std::string path = std::string(K3_SOURCE_DIR) + "/tests/data/config/no-such-config.json";
  Result<ModelConfig> r = LoadModelConfig(Env::Default(), path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no-such-config.json"));
}

// ---------------------------------------------------------------- lookup (MODEL.md §1.2) ----

TEST(ConfigLookup, AliasesAreAcceptedInNestedShape) {
  ojson j = Released();
  TextConfig(j).erase("activation_situ_beta");
  TextConfig(j)["situ_beta"] = 3.5;
  LinearAttn(j).erase("num_heads");
  LinearAttn(j)["kda_num_heads"] = 48;
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->situ_b1, 3.5f);
  EXPECT_EQ(r->kda_heads, 48);
}

TEST(ConfigLookup, PrimaryBeatsAliasInTheSameObject) {
  ojson j = Flat();
  j["num_heads"] = 2;  // primary of kda_num_heads (4)
  j["activation_situ_beta"] = 2.0;
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kda_heads, 2);
  EXPECT_EQ(r->situ_b1, 2.0f);
}

TEST(ConfigLookup, TextConfigWinsOverLinearAttnConfig) {
  ojson j = Released();
  TextConfig(j)["head_dim"] = 64;  // linear_attn_config.head_dim is 128
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kda_head_dim, 64);
}

TEST(ConfigLookup, AliasInEarlierObjectBeatsPrimaryInLaterObject) {
  ojson j = Released();
  TextConfig(j)["kda_num_heads"] = 32;  // linear_attn_config.num_heads (primary) is 96
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kda_heads, 32);
}

TEST(ConfigLookup, LinearAttnConfigWinsOverRoot) {
  ojson j = Released();
  j["num_heads"] = 7;
  j["short_conv_kernel_size"] = 9;
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kda_heads, 96);
  EXPECT_EQ(r->conv_k, 4);
}

TEST(ConfigLookup, RootIsSearchedLastInNestedShape) {
  ojson j = Released();
  TextConfig(j).erase("vocab_size");
  j["vocab_size"] = 1280;
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vocab, 1280);
}

TEST(ConfigLookup, FlatShapeReadsLinearAttnConfigUnderRoot) {
  ojson j = Flat();
  const ojson layers = j["full_attn_layers"];
  j.erase("full_attn_layers");
  j["linear_attn_config"] = {{"full_attn_layers", layers}, {"head_dim", 8}};
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->full_attn_layers, (std::vector<int>{4, 8, 12, 13}));
  EXPECT_EQ(r->kda_head_dim, 8);  // linear_attn_config (primary) beats root's kda_head_dim 16
}

// MODEL.md §1.2 reads numbers as doubles, so a whole number written as a float is that number;
// a fraction is refused (config.h: truncating would silently build a different model).
TEST(ConfigLookup, IntegralFloatsAreIntegers) {
  ojson j = Flat();
  j["hidden_size"] = 128.0;
  j["full_attn_layers"] = {4.0, 8, 12, 13};
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hidden, 128);
  EXPECT_EQ(r->full_attn_layers[0], 4);
}

TEST(ConfigRules, NonIntegerValuesRefusedNotTruncated) {
  ojson j = Flat();
  j["hidden_size"] = 128.5;
  j["num_experts"] = 8.99;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("hidden_size = 128.5 is not a whole number"));
  EXPECT_THAT(msg, HasSubstr("num_experts = 8.99 is not a whole number"));
}

TEST(ConfigRules, NonIntegerLayerIndexRefused) {
  ojson j = Flat();
  j["full_attn_layers"] = {4.7, 8, 12, 13};
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers: every entry must be a whole number (a "
                                    "one-based layer index): [0] is 4.7 is not a whole number"));
}

// ---------------------------------------------------------------- upper bounds --------------

// A billion layers used to be accepted, and pack then ran for hours with memory growing.
TEST(ConfigBounds, BillionLayersRefusedNamingTheBound) {
  ojson j = Released();
  TextConfig(j)["num_hidden_layers"] = 1000000000;
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.num_hidden_layers = 1000000000 exceeds the "
                                    "bound 4096"));
}

// Every bounded key: its bound is accepted, one more is refused naming the key and the bound.
TEST(ConfigBounds, EveryCountAndSizeHasAnUpperBound) {
  const std::pair<const char*, int> bounds[] = {
      {"num_hidden_layers", kMaxLayers},       {"hidden_size", kMaxWidth},
      {"vocab_size", kMaxVocab},               {"kda_num_heads", kMaxHeads},
      {"kda_head_dim", kMaxHeadDim},           {"short_conv_kernel_size", kMaxConvKernel},
      {"num_attention_heads", kMaxHeads},      {"q_lora_rank", kMaxWidth},
      {"kv_lora_rank", kMaxWidth},             {"qk_nope_head_dim", kMaxHeadDim},
      {"qk_rope_head_dim", kMaxHeadDim},       {"v_head_dim", kMaxHeadDim},
      {"num_experts", kMaxExperts},            {"num_shared_experts", kMaxSharedExperts},
      {"routed_expert_hidden_size", kMaxWidth}, {"moe_intermediate_size", kMaxWidth},
      {"intermediate_size", kMaxDenseInter},   {"attn_res_block_size", kMaxAttnResBlock}};
  for (const auto& [key, max] : bounds) {
    SCOPED_TRACE(key);
    ojson j = Flat();
    j[key] = max;
    Result<ModelConfig> at_bound = Parse(j);
    EXPECT_TRUE(at_bound.ok()) << at_bound.status().ToString();
    j[key] = max + 1;
    EXPECT_THAT(Refusal(j), HasSubstr(std::string(key) + " = " + std::to_string(max + 1) +
                                      " exceeds the bound " + std::to_string(max)));
  }
}

// Layers and experts each within bounds, their product (experts.idx records) not.
TEST(ConfigBounds, RoutedExpertCountBounded) {
  ojson j = Flat();
  j["num_hidden_layers"] = 1025;  // 1024 MoE layers
  j["num_experts"] = 4097;
  EXPECT_THAT(Refusal(j), HasSubstr("(num_hidden_layers 1025 - first_k_dense_replace 1) x "
                                    "num_experts 4097 = 4195328 routed experts exceeds the bound "
                                    "4194304"));
  j["num_experts"] = 4096;
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ConfigLookup, OptionalBooleansDefaultToTrue) {
  ojson j = Flat();
  j.erase("mla_use_output_gate");
  j.erase("moe_renormalize");
  j.erase("latent_moe_use_norm");
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->mla_out_gate);
  EXPECT_TRUE(r->moe_renorm);
  EXPECT_TRUE(r->latent_norm);
}

TEST(ConfigLookup, OptionalBooleansAcceptNumbersAndIgnoreOtherTypes) {
  ojson j = Flat();
  j["mla_use_output_gate"] = 0;
  j["moe_renormalize"] = false;
  j["latent_moe_use_norm"] = "no";  // not bool or number: the default (true)
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->mla_out_gate);
  EXPECT_FALSE(r->moe_renorm);
  EXPECT_TRUE(r->latent_norm);
  j["mla_use_output_gate"] = 0.5;
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->mla_out_gate);
}

TEST(ConfigLookup, TokenIdsRootFirstThenTextConfig) {
  ojson j = Released();
  j["eos_token_id"] = 5;                // root wins over text_config's 163586
  j.erase("bos_token_id");              // text_config's 163584 is used
  j.erase("pad_token_id");
  TextConfig(j).erase("pad_token_id");  // absent everywhere: -1
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->eos_token_id, 5);
  EXPECT_EQ(r->bos_token_id, 163584);
  EXPECT_EQ(r->pad_token_id, -1);
}

TEST(ConfigLookup, QuantizationConfigAtRootMeansMxfp4) {
  ojson j = Flat();
  j["moe_intermediate_size"] = 64;
  j["quantization_config"] = ojson::object();
  Result<ModelConfig> r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->experts_mxfp4);
  EXPECT_EQ(r->mxfp4_group_size, 32);
}

// ---------------------------------------------------------------- refusals ----------------

TEST(ConfigRules, MalformedJsonNamesFileAndByteOffset) {
  const std::string text = "{\"hidden_size\": 128,, \"x\": 1}";
  const size_t bad = text.find(",,") + 1;  // the second comma
  const std::string msg = Refusal(text);
  EXPECT_THAT(msg, HasSubstr("not valid JSON"));
  EXPECT_THAT(msg, HasSubstr("byte offset " + std::to_string(bad)));
}

TEST(ConfigRules, TruncatedJsonIsRefused) {
  const std::string text = ReadFixture("flat.json");
  const std::string msg = Refusal(text.substr(0, 100));
  EXPECT_THAT(msg, HasSubstr("not valid JSON at byte offset"));
}

TEST(ConfigRules, NonObjectRootRefused) {
  EXPECT_THAT(Refusal("[1, 2, 3]"), HasSubstr("top level is a JSON array"));
  EXPECT_THAT(Refusal("42"), HasSubstr("must be a JSON object"));
}

TEST(ConfigRules, DuplicateJsonKeyRefused) {
  std::string text = ReadFixture("flat.json");
  text.replace(text.find('{'), 1, "{\n  \"vocab_size\": 512,");
  const std::string msg = Refusal(text);
  EXPECT_THAT(msg, HasSubstr("duplicate JSON key"));
  EXPECT_THAT(msg, HasSubstr("vocab_size"));
}

TEST(ConfigRules, DuplicateNestedJsonKeyNamesItsPath) {
  std::string text = ReadFixture("released_config.json");
  const std::string anchor = "\"head_dim\": 128,";
  ASSERT_NE(text.find(anchor), std::string::npos);
  text.replace(text.find(anchor), anchor.size(), anchor + " \"head_dim\": 64,");
  EXPECT_THAT(Refusal(text), HasSubstr("text_config.linear_attn_config.head_dim"));
}

TEST(ConfigRules, DuplicateKeyInsideArrayNamesIndex) {
  const std::string msg = Refusal("{\"x\": [1, {\"y\": 1}, {\"z\": 1, \"z\": 2}]}");
  EXPECT_THAT(msg, HasSubstr("duplicate JSON key(s), so which value applies is ambiguous: x[2].z"));
}

TEST(ConfigRules, DeepNestingRefused) {
  // Bounded before the DOM is built, so a hostile file cannot exhaust memory or stack.
  const std::string text = "{\"a\": " + std::string(101, '[') + std::string(101, ']') + "}";
  EXPECT_THAT(Refusal(text), HasSubstr("JSON nested more than 100 levels deep"));
  const std::string ok = "{\"a\": " + std::string(99, '[') + std::string(99, ']') + "}";
  EXPECT_THAT(Refusal(ok), Not(HasSubstr("nested more than")));
}

TEST(ConfigRules, MissingLayerMapRefused) {
  ojson j = Released();
  LinearAttn(j).erase("full_attn_layers");
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("full_attn_layers"));
  EXPECT_THAT(msg, HasSubstr("missing"));
}

TEST(ConfigRules, EmptyLayerMapRefused) {
  ojson j = Flat();
  j["full_attn_layers"] = ojson::array();
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers: is an empty array"));
}

TEST(ConfigRules, LayerMapNotAnArrayRefused) {
  ojson j = Flat();
  j["full_attn_layers"] = "4,8,12,13";
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers: expected a non-empty array"));
}

TEST(ConfigRules, LayerMapTooLongRefused) {
  ojson j = Flat();
  j["num_hidden_layers"] = 1000;
  ojson layers = ojson::array();
  for (int i = 1; i <= 129; ++i) layers.push_back(i);
  j["full_attn_layers"] = layers;
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers has 129 entries; at most 128"));
}

TEST(ConfigRules, LayerEntryNotANumberRefused) {
  ojson j = Flat();
  j["full_attn_layers"] = {4, "8", 12, 13};
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers: every entry must be a whole number "
                                    "(a one-based layer index): [1] is of type string"));
}

TEST(ConfigRules, LayerIndexZeroRefused) {
  ojson j = Released();
  LinearAttn(j)["full_attn_layers"][0] = 0;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("text_config.linear_attn_config.full_attn_layers has entries "
                             "outside 1..93"));
  EXPECT_THAT(msg, HasSubstr("ONE-based"));
  EXPECT_THAT(msg, HasSubstr("[0] = 0"));
}

TEST(ConfigRules, LayerIndexAboveLayerCountRefused) {
  ojson j = Released();
  LinearAttn(j)["full_attn_layers"][23] = 94;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("outside 1..93"));
  EXPECT_THAT(msg, HasSubstr("[23] = 94"));
}

TEST(ConfigRules, DuplicateLayerIndexRefused) {
  ojson j = Flat();
  j["full_attn_layers"] = {4, 8, 8, 13};
  EXPECT_THAT(Refusal(j), HasSubstr("full_attn_layers lists layer(s) 8 more than once"));
}

TEST(ConfigRules, AllLayersMlaRefused) {
  ojson j = Flat();
  ojson layers = ojson::array();
  for (int i = 1; i <= 13; ++i) layers.push_back(i);
  j["full_attn_layers"] = layers;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("full_attn_layers lists 13 layers but num_hidden_layers is 13"));
  EXPECT_THAT(msg, HasSubstr("at least one layer must remain KDA"));
}

TEST(ConfigRules, LongOffenderListsEndWithAndNMore) {
  // 26 required keys exist, so the missing list itself can never exceed 32 entries; the
  // same 32-then-"... and N more" form is exercised on the layer entries.
  ojson j = Flat();
  j["num_hidden_layers"] = 200;
  ojson layers = ojson::array();
  for (int i = 0; i < 100; ++i) layers.push_back(300 + i);
  j["full_attn_layers"] = layers;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("[31] = 331, ... and 68 more"));
  EXPECT_THAT(msg, Not(HasSubstr("[32] = 332")));
}

TEST(ConfigRules, TopKZeroRefused) {
  ojson j = Released();
  TextConfig(j)["num_experts_per_token"] = 0;
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.num_experts_per_token = 0: top-k must be at "
                                    "least 1"));
}

TEST(ConfigRules, TopKAboveExpertsRefused) {
  ojson j = Flat();
  j["num_experts_per_token"] = 9;
  EXPECT_THAT(Refusal(j), HasSubstr("num_experts_per_token = 9 exceeds num_experts = 8"));
}

TEST(ConfigRules, TopKAbove64Refused) {
  ojson j = Released();
  TextConfig(j)["num_experts_per_token"] = 65;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("text_config.num_experts_per_token = 65 exceeds 64"));
  EXPECT_THAT(msg, Not(HasSubstr("exceeds num_experts")));  // 65 <= 896
}

TEST(ConfigRules, WrongTypeIsNamedAndCountsAsMissing) {
  ojson j = Released();
  TextConfig(j)["hidden_size"] = "7168";
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("text_config.hidden_size: expected a number, found string"));
  EXPECT_THAT(msg, HasSubstr("1 required key(s) missing or not a number"));
}

TEST(ConfigRules, NullValueCountsAsMissing) {
  ojson j = Flat();
  j["kv_lora_rank"] = nullptr;
  EXPECT_THAT(Refusal(j), HasSubstr("kv_lora_rank: expected a number, found null"));
}

TEST(ConfigRules, SeveralMissingKeysAllListed) {
  ojson j = Released();
  TextConfig(j).erase("q_lora_rank");
  TextConfig(j).erase("activation_situ_linear_beta");
  LinearAttn(j).erase("head_dim");
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("3 required key(s) missing"));
  EXPECT_THAT(msg, HasSubstr("q_lora_rank"));
  EXPECT_THAT(msg, HasSubstr("activation_situ_linear_beta (or situ_linear_beta)"));
  EXPECT_THAT(msg, HasSubstr("head_dim (or kda_head_dim)"));
  EXPECT_THAT(msg, HasSubstr("searched text_config, then text_config.linear_attn_config, "
                             "then the root"));
}

TEST(ConfigRules, EmptyObjectListsEveryRequiredKey) {
  const std::string msg = Refusal("{}");
  EXPECT_THAT(msg, HasSubstr("26 required key(s) missing"));
  for (const char* key :
       {"hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps", "num_heads",
        "head_dim", "short_conv_kernel_size", "gate_lower_bound", "num_attention_heads",
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "num_experts", "num_experts_per_token", "num_shared_experts",
        "routed_expert_hidden_size", "moe_intermediate_size", "routed_scaling_factor",
        "first_k_dense_replace", "intermediate_size", "attn_res_block_size",
        "activation_situ_beta", "activation_situ_linear_beta", "full_attn_layers"}) {
    EXPECT_THAT(msg, HasSubstr(std::string("\n      ") + key)) << key;
  }
  EXPECT_THAT(msg, Not(HasSubstr("more")));
  EXPECT_THAT(msg, Not(HasSubstr("mla_use_output_gate")));  // optional
}

TEST(ConfigRules, EveryProblemIsListedNotJustTheFirst) {
  ojson j = Flat();
  j.erase("vocab_size");
  j["num_experts_per_token"] = 0;
  j["attn_res_block_size"] = 0;
  j["full_attn_layers"] = {0, 8, 12, 13};
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("4 problem(s)"));
  EXPECT_THAT(msg, HasSubstr("vocab_size"));
  EXPECT_THAT(msg, HasSubstr("num_experts_per_token = 0"));
  EXPECT_THAT(msg, HasSubstr("attn_res_block_size = 0 must be > 0"));
  EXPECT_THAT(msg, HasSubstr("[0] = 0"));
}

TEST(ConfigRules, NonPositiveLayersHiddenVocabRefused) {
  ojson j = Flat();
  j["num_hidden_layers"] = 0;
  j["hidden_size"] = -1;
  j["vocab_size"] = 0;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("num_hidden_layers = 0 must be > 0"));
  EXPECT_THAT(msg, HasSubstr("hidden_size = -1 must be > 0"));
  EXPECT_THAT(msg, HasSubstr("vocab_size = 0 must be > 0"));
}

TEST(ConfigRules, AttnResBlockSizeZeroRefused) {
  ojson j = Flat();
  j["attn_res_block_size"] = 0;
  EXPECT_THAT(Refusal(j), HasSubstr("attn_res_block_size = 0 must be > 0"));
}

TEST(ConfigRules, ConvKernelZeroRefused) {
  ojson j = Released();
  LinearAttn(j)["short_conv_kernel_size"] = 0;
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.linear_attn_config.short_conv_kernel_size = 0 "
                                    "must be >= 1"));
}

TEST(ConfigRules, ZeroTensorDimensionRefused) {
  ojson j = Flat();
  j["q_lora_rank"] = 0;
  j["kda_head_dim"] = 0;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("q_lora_rank = 0 must be > 0"));
  EXPECT_THAT(msg, HasSubstr("kda_head_dim = 0 must be > 0"));
}

TEST(ConfigRules, ZeroSharedExpertsAccepted) {
  ojson j = Flat();
  j["num_shared_experts"] = 0;
  EXPECT_TRUE(Parse(j).ok());
  j["num_shared_experts"] = -1;
  EXPECT_THAT(Refusal(j), HasSubstr("num_shared_experts = -1 must be >= 0"));
}

TEST(ConfigRules, NonPositiveBetaRefused) {
  ojson j = Flat();
  j["situ_beta"] = 0;
  j["situ_linear_beta"] = -25.0;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("situ_beta = 0 must be > 0"));
  EXPECT_THAT(msg, HasSubstr("situ_linear_beta = -25 must be > 0"));
}

TEST(ConfigRules, FirstDenseOutsideLayerRangeRefused) {
  ojson j = Flat();
  j["first_k_dense_replace"] = 14;
  EXPECT_THAT(Refusal(j), HasSubstr("first_k_dense_replace = 14 must be in "
                                    "0..num_hidden_layers (13)"));
  j["first_k_dense_replace"] = -1;
  EXPECT_THAT(Refusal(j), HasSubstr("first_k_dense_replace = -1"));
}

TEST(ConfigRules, IntegerOutOfRangeRefused) {
  ojson j = Flat();
  j["intermediate_size"] = 1e12;
  EXPECT_THAT(Refusal(j), HasSubstr("intermediate_size = 1000000000000.0 does not fit a "
                                    "32-bit integer"));
}

TEST(ConfigRules, FloatOutOfRangeRefused) {
  ojson j = Flat();
  j["rms_norm_eps"] = 1e39;
  EXPECT_THAT(Refusal(j), HasSubstr("rms_norm_eps = 1e+39 is outside the range of a 32-bit "
                                    "float"));
}

TEST(ConfigRules, NumberOverflowRefused) {
  std::string text = ReadFixture("flat.json");
  text.replace(text.find("1e-05"), 5, "1e999");
  EXPECT_THAT(Refusal(text), HasSubstr("number overflow"));
}

TEST(ConfigRules, TextConfigNotAnObjectRefused) {
  ojson j = Flat();
  j["text_config"] = "see root";
  EXPECT_THAT(Refusal(j), HasSubstr("text_config: expected an object"));
}

TEST(ConfigRules, LinearAttnConfigNotAnObjectRefused) {
  ojson j = Released();
  LinearAttn(j) = ojson::array({1, 2});
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.linear_attn_config: expected an object"));
}

TEST(ConfigRules, TokenIdWrongTypeRefused) {
  ojson j = Released();
  j["eos_token_id"] = ojson::array({163586, 163585});
  EXPECT_THAT(Refusal(j), HasSubstr("eos_token_id: expected an integer token id, found array"));
}

// ---------------------------------------------------------------- MXFP4 (DESIGN.md §4) ------

TEST(ConfigMxfp4, FlatWithQuantizationConfigRefusesMoeIntermediate48) {
  ojson j = Flat();
  j["quantization_config"] = Released()["text_config"]["quantization_config"];
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("moe_intermediate_size = 48 is not a multiple of 32"));
  EXPECT_THAT(msg, Not(HasSubstr("routed_expert_hidden_size = 64")));  // 64 is fine
}

TEST(ConfigMxfp4, LatentNotMultipleOf32Refused) {
  ojson j = Released();
  TextConfig(j)["routed_expert_hidden_size"] = 3580;
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.routed_expert_hidden_size = 3580 is not a "
                                    "multiple of 32"));
}

TEST(ConfigMxfp4, GroupSize16Refused) {
  ojson j = Released();
  TextConfig(j)["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  const std::string msg = Refusal(j);
  EXPECT_THAT(msg, HasSubstr("text_config.quantization_config.config_groups.group_0.weights."
                             "group_size is 16"));
  EXPECT_THAT(msg, HasSubstr("must be 32"));
}

TEST(ConfigMxfp4, GroupSizeWrongTypeRefused) {
  ojson j = Released();
  TextConfig(j)["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] =
      "32";
  EXPECT_THAT(Refusal(j), HasSubstr("group_size is \"32\""));
}

TEST(ConfigMxfp4, OtherQuantizationFormatRefused) {
  ojson j = Released();
  TextConfig(j)["quantization_config"]["format"] = "float-quantized";
  EXPECT_THAT(Refusal(j), HasSubstr("text_config.quantization_config.format is "
                                    "\"float-quantized\""));
}

TEST(ConfigMxfp4, QuantizationConfigNotAnObjectRefused) {
  ojson j = Flat();
  j["moe_intermediate_size"] = 64;
  j["quantization_config"] = true;
  EXPECT_THAT(Refusal(j), HasSubstr("quantization_config: expected an object, found boolean"));
}

TEST(ConfigMxfp4, ValidateMxfp4DimsForU8Experts) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  const Status s = ValidateMxfp4Dims(*r, "shards/model-00002.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("shards/model-00002.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("moe_intermediate_size = 48 is not a multiple of 32"));
  ModelConfig ok = *r;
  ok.moe_inter = 64;
  EXPECT_TRUE(ValidateMxfp4Dims(ok, "x").ok());
}

// ---------------------------------------------------------------- writers -----------------

TEST(ConfigWriter, CanonicalJsonOfFlatFixture) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(CanonicalConfigJson(*r),
            "{\"activation_situ_beta\":4.0,\"activation_situ_linear_beta\":25.0,"
            "\"attn_res_block_size\":3,\"bos_token_id\":-1,\"eos_token_id\":-1,"
            "\"experts_mxfp4\":false,\"first_k_dense_replace\":1,"
            "\"full_attn_layers\":[4,8,12,13],\"gate_lower_bound\":-5.0,\"head_dim\":16,"
            "\"hidden_size\":128,\"intermediate_size\":96,\"kv_lora_rank\":32,"
            "\"latent_moe_use_norm\":true,\"media_placeholder_token_id\":-1,"
            "\"mla_use_output_gate\":true,\"moe_intermediate_size\":48,"
            "\"moe_renormalize\":true,\"mxfp4_group_size\":32,\"num_attention_heads\":4,"
            "\"num_experts\":8,\"num_experts_per_token\":2,\"num_heads\":4,"
            "\"num_hidden_layers\":13,\"num_shared_experts\":2,\"pad_token_id\":-1,"
            "\"q_lora_rank\":64,\"qk_nope_head_dim\":24,\"qk_rope_head_dim\":8,"
            "\"rms_norm_eps\":1e-05,\"routed_expert_hidden_size\":64,"
            "\"routed_scaling_factor\":1.0,\"short_conv_kernel_size\":4,\"v_head_dim\":16,"
            "\"vocab_size\":256}");
}

TEST(ConfigWriter, CanonicalJsonIgnoresShapeAndKeyOrder) {
  // The same model in the released shape and in the flat shape gives the same bytes.
  Result<ModelConfig> released = Parse(Released());
  ASSERT_TRUE(released.ok());
  ojson flat = ojson::parse(ReleasedConfigJson(*released));
  ojson moved = flat["text_config"];
  const ojson lin = moved["linear_attn_config"];
  moved.erase("linear_attn_config");
  for (const auto& [k, v] : lin.items()) moved[k] = v;
  for (const char* k : {"bos_token_id", "media_placeholder_token_id"}) moved[k] = flat[k];
  Result<ModelConfig> from_flat = Parse(moved);
  ASSERT_TRUE(from_flat.ok()) << from_flat.status().ToString();
  EXPECT_EQ(CanonicalConfigJson(*from_flat), CanonicalConfigJson(*released));
}

TEST(ConfigWriter, CanonicalJsonParsesBackToTheSameConfig) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  Result<ModelConfig> back = ParseModelConfig(CanonicalConfigJson(*r), "canonical");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == *r);
}

TEST(ConfigWriter, ReleasedShapeRoundTripsTinyAndReleasedDims) {
  for (const ojson& fixture : {Flat(), Released()}) {
    Result<ModelConfig> r = Parse(fixture);
    ASSERT_TRUE(r.ok());
    const std::string text = ReleasedConfigJson(*r);
    Result<ModelConfig> back = ParseModelConfig(text, "written");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == *r) << text;
    EXPECT_EQ(CanonicalConfigJson(*back), CanonicalConfigJson(*r));
  }
}

TEST(ConfigWriter, ReleasedShapeRoundTripsNonDefaultBooleansAndTinyPreset) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  ModelConfig c = *r;
  c.mla_out_gate = false;
  c.latent_norm = false;
  c.moe_inter = 64;  // DESIGN.md §8 tiny preset: MXFP4 experts
  c.experts_mxfp4 = true;
  c.rms_eps = 1e-6f;
  c.vocab = 1280;
  c.bos_token_id = 1024;
  c.eos_token_id = 1026;
  Result<ModelConfig> back = ParseModelConfig(ReleasedConfigJson(c), "written");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == c);
}

TEST(ConfigWriter, ReleasedShapeMatchesTheReleaseOnEveryKeyItWrites) {
  const ojson release = Released();
  Result<ModelConfig> r = Parse(release);
  ASSERT_TRUE(r.ok());
  const ojson written = ojson::parse(ReleasedConfigJson(*r));
  size_t compared = 0;
  for (const auto& [key, value] : written.items()) {
    if (key == "text_config") continue;
    ASSERT_TRUE(release.contains(key)) << key;
    EXPECT_EQ(value, release[key]) << key;
    ++compared;
  }
  for (const auto& [key, value] : written["text_config"].items()) {
    ASSERT_TRUE(release["text_config"].contains(key)) << "text_config." << key;
    EXPECT_EQ(value, release["text_config"][key]) << "text_config." << key;
    ++compared;
  }
  EXPECT_EQ(compared, 8u + 43u);  // root keys, text_config keys
  EXPECT_EQ(written["text_config"]["linear_attn_config"]["kda_layers"].size(), 69u);
}

TEST(ConfigWriter, ReleasedShapeOmitsQuantizationConfigForUnquantisedExperts) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  const ojson written = ojson::parse(ReleasedConfigJson(*r));
  EXPECT_FALSE(written["text_config"].contains("quantization_config"));
  EXPECT_FALSE(written.contains("eos_token_id"));  // -1: absent
  EXPECT_EQ(written["text_config"]["linear_attn_config"]["kda_layers"],
            ojson::array({1, 2, 3, 5, 6, 7, 9, 10, 11}));
}

TEST(ConfigWriter, ReleasedShapeIsPrettyPrinted) {
  Result<ModelConfig> r = Parse(Flat());
  ASSERT_TRUE(r.ok());
  const std::string text = ReleasedConfigJson(*r);
  EXPECT_EQ(text.rfind("{\n  \"architectures\": [\n    \"KimiK3ForConditionalGeneration\"\n  ],\n",
                       0),
            0u)
      << text.substr(0, 120);
  EXPECT_EQ(text.back(), '\n');
}

TEST(ConfigWriter, JsonNumberForFloatRoundTripsAndIsShort) {
  EXPECT_EQ(JsonNumberForFloat(1e-5f), 1e-05);
  EXPECT_EQ(JsonNumberForFloat(-5.0f), -5.0);
  EXPECT_EQ(JsonNumberForFloat(0.1f), 0.1);
  // Every float reached by a bit walk reads back exactly through (float)(double).
  uint32_t bits = 1;
  for (int i = 0; i < 200000; ++i) {
    bits = bits * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    if (!std::isfinite(f)) continue;
    const double d = JsonNumberForFloat(f);
    ASSERT_EQ(static_cast<float>(d), f) << bits;
  }
}

}  // namespace
}  // namespace k3
