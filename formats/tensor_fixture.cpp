// Tensor fixture files: strict reader, canonical writer, sample-index choice.
#include "formats/tensor_fixture.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "formats/json_listing.h"
#include "formats/manifest_json.h"

namespace k3::fixture {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

Result<std::vector<uint64_t>> ParseShape(const json& arr, const std::string& where) {
  std::vector<uint64_t> shape;
  uint64_t numel = 1;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& d = arr[i];
    if (!d.is_number_unsigned()) {
      return Status::Invalid(mjson::ElementPath(where, i) + ": expected an unsigned integer, found " +
                             (d.is_number() ? d.dump() : std::string(d.type_name())));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v != 0 && numel > UINT64_MAX / v) {
      return Status::Invalid(where + ": element count overflows 64 bits");
    }
    numel *= v;
    shape.push_back(v);
  }
  if (shape.size() > 8) return Status::Invalid(where + ": rank " + std::to_string(shape.size()) +
                                               " exceeds 8 (the safetensors limit)");
  return shape;
}

Status ParseSamples(const json& arr, const std::string& where, Entry* e) {
  if (arr.size() > kMaxSamples) {
    return Status::Invalid(where + ": " + std::to_string(arr.size()) + " samples, at most " +
                           std::to_string(kMaxSamples) + " allowed");
  }
  const uint64_t numel = e->numel();
  const int digits = e->SampleHexDigits();
  std::set<uint64_t> seen;
  for (size_t i = 0; i < arr.size(); ++i) {
    K3_ASSIGN_OR_RETURN(mjson::ObjectReader r,
                        mjson::ObjectReader::Make(arr[i], mjson::ElementPath(where, i)));
    Sample s;
    K3_ASSIGN_OR_RETURN(s.index, r.Unsigned("index"));
    K3_ASSIGN_OR_RETURN(std::string bits, r.String("bits"));
    K3_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
    if (s.index >= numel) {
      return Status::Invalid(r.Path("index") + ": " + std::to_string(s.index) +
                             " is outside the tensor (" + std::to_string(numel) + " elements)");
    }
    if (!seen.insert(s.index).second) {
      return Status::Invalid(r.Path("index") + ": index " + std::to_string(s.index) +
                             " is sampled twice");
    }
    // Exactly `digits` digits: the width says the element size, so a BF16 sample written with
    // F32 width is caught instead of silently zero-extended.
    if (!ParseHexUint(bits, static_cast<size_t>(digits), &s.bits)) {
      return Status::Invalid(r.Path("bits") + ": \"" + bits + "\" must be exactly " +
                             std::to_string(digits) + " lowercase hex digits (the " +
                             e->DTypeString() + " element's bit pattern)");
    }
    e->samples.push_back(s);
  }
  return Status::Ok();
}

Result<Entry> ParseEntry(const json& value, const std::string& where0) {
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader r, mjson::ObjectReader::Make(value, where0));
  Entry e;
  K3_ASSIGN_OR_RETURN(e.name, r.String("name"));
  if (e.name.empty()) return Status::Invalid(r.Path("name") + ": empty tensor name");
  // From here on messages name the tensor too.
  K3_ASSIGN_OR_RETURN(r, mjson::ObjectReader::Make(value, where0 + " \"" + e.name + "\""));
  K3_ASSIGN_OR_RETURN(e.name, r.String("name"));
  K3_ASSIGN_OR_RETURN(std::string dtype, r.String("dtype"));
  if (dtype == kMxfp4DType) {
    e.mxfp4 = true;
  } else if (auto d = ParseDType(dtype)) {
    e.dtype = *d;
  } else {
    return Status::Invalid(r.Path("dtype") + ": unknown dtype \"" + dtype + "\" (one of " +
                           std::string(SupportedDTypeList()) + ", or MXFP4)");
  }
  K3_ASSIGN_OR_RETURN(const json* shape, r.Array("shape"));
  K3_ASSIGN_OR_RETURN(e.shape, ParseShape(*shape, r.Path("shape")));
  if (e.mxfp4 && (e.shape.size() != 2 || e.shape[1] % 32 != 0)) {
    return Status::Invalid(r.Path("shape") +
                           ": an MXFP4 entry is a [rows, cols] matrix with cols a multiple of 32");
  }
  K3_ASSIGN_OR_RETURN(std::string hash, r.String("xxh3_128"));
  if (!Hash128::FromHex(hash, &e.xxh3_128)) {
    return Status::Invalid(r.Path("xxh3_128") + ": \"" + hash +
                           "\" must be 32 lowercase hex digits (XXH128 canonical form)");
  }
  K3_ASSIGN_OR_RETURN(const json* samples, r.Array("samples"));
  K3_RETURN_IF_ERROR(ParseSamples(*samples, r.Path("samples"), &e));
  K3_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  return e;
}

}  // namespace

uint64_t Entry::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

int Entry::SampleHexDigits() const {
  return mxfp4 ? 8 : static_cast<int>(2 * DTypeSize(dtype));
}

std::string Entry::DTypeString() const {
  return mxfp4 ? std::string(kMxfp4DType) : std::string(DTypeName(dtype));
}

Result<FixtureFile> ParseFixture(std::string_view text, const std::string& source) {
  K3_ASSIGN_OR_RETURN(json doc, mjson::ParseStrict(text, source));
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader top, mjson::ObjectReader::Make(doc, source));
  K3_ASSIGN_OR_RETURN(std::string format, top.String("format"));
  if (format != kFormat) {
    return Status::Invalid(top.Path("format") + ": \"" + format + "\" is not \"" +
                           std::string(kFormat) + "\" (not a tensor fixture file)");
  }
  K3_ASSIGN_OR_RETURN(uint64_t version, top.Unsigned("version"));
  if (version != kVersion) {
    return Status::Invalid(top.Path("version") + ": version " + std::to_string(version) +
                           " is not supported (this k3 reads version " +
                           std::to_string(kVersion) + ")");
  }
  K3_ASSIGN_OR_RETURN(const json* tensors, top.Array("tensors"));
  K3_RETURN_IF_ERROR(top.CheckNoUnknownKeys());
  FixtureFile out;
  std::set<std::string> names;
  for (size_t i = 0; i < tensors->size(); ++i) {
    K3_ASSIGN_OR_RETURN(Entry e,
                        ParseEntry((*tensors)[i], mjson::ElementPath(top.Path("tensors"), i)));
    if (!names.insert(e.name).second) {
      return Status::Invalid(mjson::ElementPath(top.Path("tensors"), i) + ": tensor \"" + e.name +
                             "\" is listed twice");
    }
    out.entries.push_back(std::move(e));
  }
  return out;
}

Result<FixtureFile> LoadFixture(Env* env, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, kMaxFixtureBytes));
  return ParseFixture(text, path);
}

std::string RenderFixture(const FixtureFile& f) {
  std::vector<const Entry*> sorted;
  for (const Entry& e : f.entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry* a, const Entry* b) { return a->name < b->name; });
  // One entry per line: readable, diffable, and compact for the released model's ~500k tensors.
  ojson tensors = ojson::array();
  for (const Entry* e : sorted) {
    ojson j;
    j["name"] = e->name;
    j["dtype"] = e->DTypeString();
    j["shape"] = e->shape;
    j["xxh3_128"] = e->xxh3_128.Hex();
    std::vector<Sample> samples = e->samples;
    std::sort(samples.begin(), samples.end(),
              [](const Sample& a, const Sample& b) { return a.index < b.index; });
    ojson js = ojson::array();
    for (const Sample& s : samples) {
      js.push_back(ojson{{"index", s.index}, {"bits", HexUint(s.bits, e->SampleHexDigits())}});
    }
    j["samples"] = std::move(js);
    tensors.push_back(std::move(j));
  }
  ojson doc;
  doc["format"] = std::string(kFormat);
  doc["version"] = kVersion;
  doc["tensors"] = std::move(tensors);
  return listing::Dump(doc);
}

Status WriteFixture(Env* env, const std::string& path, const FixtureFile& f) {
  return WriteFileAtomic(env, path, RenderFixture(f));
}

std::vector<uint64_t> SampleIndices(uint64_t numel) {
  std::vector<uint64_t> out;
  if (numel == 0) return out;
  constexpr uint64_t kSteps = 7;
  for (uint64_t i = 0; i <= kSteps; ++i) {
    // (numel − 1)·i/7 without overflow: numel < 2^64 and i ≤ 7, split the product.
    const uint64_t last = numel - 1;
    const uint64_t idx = last / kSteps * i + last % kSteps * i / kSteps;
    if (out.empty() || out.back() != idx) out.push_back(idx);
  }
  return out;
}

}  // namespace k3::fixture
