#include "k3verify/verify_tensors.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <regex>

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "common/parallel.h"
#include "common/sysinfo.h"
#include "formats/tensor_fixture.h"
#include "k3verify/tensor_source.h"
#include "k3verify/verdict.h"

namespace k3::verify {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// Runs fn(i, files) for i in [0, n) on `jobs` threads, each with its own open-file cache.
void ForEachWithFiles(size_t n, int jobs, const std::function<void(size_t, FileCache*)>& fn) {
  std::vector<FileCache> caches(ParallelWorkers(n, jobs));
  ParallelFor(n, jobs, [&](size_t i, size_t worker) { fn(i, &caches[worker]); });
}

// The problems of one fixture entry against the directory's tensor.
std::vector<Status> CheckEntry(Env* env, FileCache* files, const TensorDir& dir,
                               const std::string& dir_path, const fixture::Entry& e,
                               Progress* progress) {
  std::vector<Status> out;
  const std::string who = "tensor \"" + e.name + "\"";
  auto found = dir.Find(e.name, e.mxfp4);
  if (!found.ok()) return {found.status()};
  if (!found->has_value()) {
    return {Status::Invalid(who + ": listed in the fixture but not found in " + dir_path + " (" +
                            dir.kind() + ")" +
                            (e.mxfp4 ? " as an MXFP4 weight_packed/weight_scale pair" : ""))};
  }
  const TensorRef& ref = **found;
  const bool same_dtype = e.mxfp4 || ref.dtype == e.dtype;
  if (!same_dtype) {
    out.push_back(Status::Integrity(who + ": dtype: the fixture records " + e.DTypeString() +
                                    ", " + dir_path + " has " + DTypeName(ref.dtype)));
  }
  if (ref.shape != e.shape) {
    out.push_back(Status::Integrity(who + ": shape: the fixture records " + ShapeString(e.shape) +
                                    ", " + dir_path + " has " + ShapeString(ref.shape)));
  }
  // Samples are compared only when they mean the same thing (same element type, in range).
  std::vector<uint64_t> indices;
  std::vector<const fixture::Sample*> samples;
  for (const fixture::Sample& s : e.samples) {
    if (same_dtype && s.index < ref.numel()) {
      indices.push_back(s.index);
      samples.push_back(&s);
    }
  }
  auto content = ReadTensor(env, files, ref, indices, [&](uint64_t n) { progress->Add(n); });
  if (!content.ok()) {
    out.push_back(content.status());
    return out;
  }
  if (content->xxh3_128 != e.xxh3_128) {
    out.push_back(Status::Integrity(who + ": xxh3_128: the fixture records " + e.xxh3_128.Hex() +
                                    ", " + dir_path + " has " + content->xxh3_128.Hex()));
  }
  const int digits = e.SampleHexDigits();
  for (size_t k = 0; k < samples.size(); ++k) {
    if (content->bits[k] != samples[k]->bits) {
      out.push_back(Status::Integrity(
          who + ": sample[index " + std::to_string(samples[k]->index) + "]: the fixture records " +
          HexUint(samples[k]->bits, digits) + ", " + dir_path + " has " +
          HexUint(content->bits[k], digits) +
          (e.mxfp4 ? " (dequantised fp32 bits)" : "")));
    }
  }
  return out;
}

Result<std::vector<std::regex>> CompileNames(const std::vector<std::string>& names) {
  std::vector<std::regex> out;
  for (const std::string& n : names) {
    try {
      out.emplace_back(n, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return Status::Invalid("--names \"" + n + "\": not a valid regular expression (" + e.what() +
                             ")");
    }
  }
  return out;
}

bool Selected(const std::vector<std::regex>& names, const std::string& name) {
  if (names.empty()) return true;
  return std::any_of(names.begin(), names.end(),
                     [&](const std::regex& r) { return std::regex_search(name, r); });
}

void RunCheck(Env* env, const TensorsOptions& o, const TensorDir& dir,
              const std::vector<std::regex>& names, TensorsReport* r) {
  auto fx = fixture::LoadFixture(env, o.fixtures);
  if (!fx.ok()) {
    r->problems.push_back(fx.status());
    return;
  }
  std::vector<const fixture::Entry*> entries;
  uint64_t total = 0;
  for (const fixture::Entry& e : fx->entries) {
    if (!Selected(names, e.name)) continue;
    entries.push_back(&e);
    total += e.mxfp4 ? e.numel() / 2 + e.numel() / 32 : e.numel() * DTypeSize(e.dtype);
  }
  Progress progress("tensors", total, o.progress);
  std::vector<std::vector<Status>> found(entries.size());
  ForEachWithFiles(entries.size(), o.jobs, [&](size_t i, FileCache* files) {
    found[i] = CheckEntry(env, files, dir, o.dir, *entries[i], &progress);
  });
  progress.Finish();
  r->tensors = entries.size();
  r->bytes = progress.done_bytes();
  for (auto& v : found) {
    for (Status& s : v) r->problems.push_back(std::move(s));
  }
}

void RunEmit(Env* env, const TensorsOptions& o, const TensorDir& dir,
             const std::vector<std::regex>& names, TensorsReport* r) {
  std::vector<TensorRef> refs;
  uint64_t total = 0;
  for (TensorRef& ref : dir.All(&r->skipped)) {
    if (!Selected(names, ref.name)) continue;
    total += ref.bytes();
    refs.push_back(std::move(ref));
  }
  Progress progress("tensors", total, o.progress);
  fixture::FixtureFile out;
  out.entries.resize(refs.size());
  std::vector<Status> failed(refs.size());
  ForEachWithFiles(refs.size(), o.jobs, [&](size_t i, FileCache* files) {
    const TensorRef& ref = refs[i];
    fixture::Entry& e = out.entries[i];
    e.name = ref.name;
    e.mxfp4 = ref.mxfp4;
    e.dtype = ref.dtype;
    e.shape = ref.shape;
    const std::vector<uint64_t> indices = fixture::SampleIndices(ref.numel());
    auto content = ReadTensor(env, files, ref, indices, [&](uint64_t n) { progress.Add(n); });
    if (!content.ok()) {
      failed[i] = content.status();
      return;
    }
    e.xxh3_128 = content->xxh3_128;
    for (size_t k = 0; k < indices.size(); ++k) e.samples.push_back({indices[k], content->bits[k]});
  });
  progress.Finish();
  r->tensors = refs.size();
  r->bytes = progress.done_bytes();
  for (Status& s : failed) {
    if (!s.ok()) r->problems.push_back(std::move(s));
  }
  if (!r->problems.empty()) {
    r->problems.push_back(Status::Io(o.emit + ": not written, because " +
                                     std::to_string(r->problems.size()) +
                                     " tensor(s) could not be read"));
    return;
  }
  Status w = fixture::WriteFixture(env, o.emit, out);
  if (!w.ok()) r->problems.push_back(w);
}

}  // namespace

Status TensorsReport::Verdict() const { return WorstVerdict(problems, dir); }

Result<TensorsReport> VerifyTensors(Env* env, const TensorsOptions& o) {
  if (o.fixtures.empty() == o.emit.empty()) {
    return Status::Invalid("give exactly one of --fixtures FILE (check) or --emit FILE (record)");
  }
  K3_ASSIGN_OR_RETURN(std::vector<std::regex> names, CompileNames(o.names));
  TensorsReport r;
  r.dir = o.dir;
  r.fixtures = o.fixtures;
  r.emit = o.emit;
  const auto t0 = std::chrono::steady_clock::now();
  auto dir = TensorDir::Open(env, o.dir, o.model_dir);
  if (!dir.ok()) {
    r.problems.push_back(dir.status());
    return r;
  }
  r.kind = dir->kind();
  TensorsOptions opts = o;
  opts.jobs = std::max(1, o.jobs > 0 ? o.jobs : CoreCount());
  if (!o.fixtures.empty()) {
    RunCheck(env, opts, *dir, names, &r);
  } else {
    RunEmit(env, opts, *dir, names, &r);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string RenderTensorsText(const TensorsReport& r) {
  std::string out = r.dir + (r.kind.empty() ? "" : " (" + r.kind + ")") + "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%s %llu tensors (%.3f GB read in %.1f s)%s\n",
                r.emit.empty() ? "checked" : "recorded",
                static_cast<unsigned long long>(r.tensors), static_cast<double>(r.bytes) / 1e9,
                r.seconds,
                r.skipped ? (", " + std::to_string(r.skipped) +
                             " tensors outside the language model and the vision part skipped").c_str()
                          : "");
  out += line;
  out += r.emit.empty() ? "fixture: " + r.fixtures + "\n" : "";
  out += ProblemLines(r.problems, 50);
  const Status v = r.Verdict();
  if (v.ok() && !r.emit.empty()) out += "wrote " + r.emit + "\n";
  out += v.ok() ? "verdict: OK\n" : "verdict: " + v.ToString() + "\n";
  return out;
}

std::string RenderTensorsJson(const TensorsReport& r) {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["dir"] = r.dir;
  j["kind"] = r.kind.empty() ? ojson(nullptr) : ojson(r.kind);
  j["fixtures"] = r.fixtures.empty() ? ojson(nullptr) : ojson(r.fixtures);
  j["emit"] = r.emit.empty() ? ojson(nullptr) : ojson(r.emit);
  j["tensors"] = r.tensors;
  j["skipped"] = r.skipped;
  j["bytes"] = r.bytes;
  j["seconds"] = r.seconds;
  j["problems"] = ojson::array();
  for (const Status& p : r.problems) {
    j["problems"].push_back(
        ojson{{"code", p.exit_code()}, {"kind", CodeName(p.code())}, {"message", p.message()}});
  }
  const Status v = r.Verdict();
  j["ok"] = v.ok();
  j["exit_code"] = v.exit_code();
  return j.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

}  // namespace k3::verify
