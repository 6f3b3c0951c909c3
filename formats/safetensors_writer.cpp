// The streaming safetensors writer. The header is complete before the first data byte (all
// offsets follow from the declared shapes), so the data can stream straight from a generator
// with constant memory. The file only gets its final name after every declared byte arrived and
// was fsynced; any failure, or destruction without Finish, removes the temporary.
#include <algorithm>

#include "common/hex.h"
#include "formats/safetensors.h"

namespace k3::st {
namespace {

// The data section starts at a multiple of this (safetensors ≥ 0.6 pads the same way), so
// 8-byte elements are naturally aligned when the file is mapped or read into aligned memory.
constexpr uint64_t kDataAlignment = 8;

std::string ParentDirOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// JSON string literal for UTF-8 text (validity is checked before the header is built). The one
// hand-written JSON escaper in k3 (elsewhere nlohmann writes JSON): the header's exact bytes
// are part of every synthetic shard, whose hashes the reference fixtures record, so its
// escaping, key order, compactness and padding stay under this file's control.
void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += "\\u00";
      AppendHexByte(out, c);
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace

struct Writer::Impl {
  enum class Phase { kDeclaring, kWriting, kFinished, kFailed };

  Env* env;
  std::string path;
  std::string tmp_path;
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors;
  uint64_t data_bytes = 0;
  Status declare_error;  // the first bad Add, reported by Begin
  std::string header;    // JSON plus padding; empty until built
  Phase phase = Phase::kDeclaring;
  std::unique_ptr<File> file;
  std::unique_ptr<BufferedWriter> out;
  bool temp_created = false;
  uint64_t appended = 0;

  Status Usage(std::optional<std::string_view> tensor, std::string_view rule,
               const std::string& detail) const {
    std::string msg = path + ": ";
    if (tensor) msg += "tensor " + PrintableName(*tensor) + ": ";
    msg += detail + " [rule: " + std::string(rule) + "]";
    return Status::Invalid(std::move(msg));
  }

  void Declare(std::string name, DType dtype, std::vector<uint64_t> shape) {
    if (!declare_error.ok()) return;
    if (phase != Phase::kDeclaring) {
      declare_error = Usage(name, "declare every tensor before Begin", "Add after Begin");
      return;
    }
    if (name.empty() || name.size() > kMaxNameBytes || FindInvalidUtf8(name) ||
        name == "__metadata__") {
      declare_error = Usage(name, "tensor names are non-empty, at most 4096 bytes, UTF-8",
                            "the name cannot be written");
      return;
    }
    if (shape.size() > kMaxRank) {
      declare_error = Usage(name, "rank is at most 8",
                            "the shape has " + std::to_string(shape.size()) + " dimensions");
      return;
    }
    const std::optional<uint64_t> bytes = CheckedByteSize(dtype, shape);
    uint64_t end = 0;
    if (!bytes || __builtin_add_overflow(data_bytes, *bytes, &end)) {
      declare_error = Usage(name, "the data section size fits in 64 bits",
                            "the tensor's byte size overflows");
      return;
    }
    TensorInfo& t = tensors.emplace_back();
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.begin = data_bytes;
    t.end = end;
    data_bytes = end;
    header.clear();
  }

  // JSON in the order ParseHeader reads fastest: __metadata__ first, then the tensors in
  // declaration order, which is ascending offset order.
  const std::string& Header() {
    if (!header.empty()) return header;
    header.reserve(64 + tensors.size() * 128);
    header += '{';
    if (!metadata.empty()) {
      header += "\"__metadata__\":{";
      for (const auto& [k, v] : metadata) {
        AppendJsonString(header, k);
        header += ':';
        AppendJsonString(header, v);
        header += ',';
      }
      header.back() = '}';
      header += ',';
    }
    for (const TensorInfo& t : tensors) {
      AppendJsonString(header, t.name);
      header += ":{\"dtype\":\"";
      header += DTypeName(t.dtype);
      header += "\",\"shape\":[";
      for (size_t i = 0; i < t.shape.size(); ++i) {
        if (i > 0) header += ',';
        header += std::to_string(t.shape[i]);
      }
      header += "],\"data_offsets\":[";
      header += std::to_string(t.begin);
      header += ',';
      header += std::to_string(t.end);
      header += "]},";
    }
    if (header.back() == ',') header.pop_back();
    header += '}';
    const uint64_t unaligned = 8 + header.size();
    const uint64_t pad = (kDataAlignment - unaligned % kDataAlignment) % kDataAlignment;
    header.append(static_cast<size_t>(pad), ' ');
    return header;
  }

  // The tensor that owns data byte `offset` (the last one when offset is past the end).
  const TensorInfo* TensorAt(uint64_t offset) const {
    if (tensors.empty()) return nullptr;
    const auto it = std::upper_bound(
        tensors.begin(), tensors.end(), offset,
        [](uint64_t off, const TensorInfo& t) { return off < t.end; });
    return it == tensors.end() ? &tensors.back() : &*it;
  }

  std::optional<std::string_view> NameAt(uint64_t offset) const {
    const TensorInfo* t = TensorAt(offset);
    if (t == nullptr) return std::nullopt;
    return std::string_view(t->name);
  }

  // Closes and deletes the temporary; the error that led here is what the caller reports.
  void Discard() {
    out.reset();
    if (file) {
      (void)file->Close();
      file.reset();
    }
    if (temp_created && env->Exists(tmp_path)) (void)env->Remove(tmp_path);
    temp_created = false;
    if (phase != Phase::kFinished) phase = Phase::kFailed;
  }

  Status FailWith(Status s) {
    Discard();
    return s;
  }
};

Writer::Writer(Env* env, std::string path) : impl_(std::make_unique<Impl>()) {
  impl_->env = env;
  impl_->tmp_path = TempPathFor(path);
  impl_->path = std::move(path);
}

Writer::~Writer() {
  if (impl_->phase != Impl::Phase::kFinished) impl_->Discard();
}

void Writer::SetMetadata(std::map<std::string, std::string> metadata) {
  impl_->metadata = std::move(metadata);
  impl_->header.clear();
}

void Writer::Add(std::string name, DType dtype, std::vector<uint64_t> shape) {
  impl_->Declare(std::move(name), dtype, std::move(shape));
}

uint64_t Writer::FileSize() const { return 8 + impl_->Header().size() + impl_->data_bytes; }

Status Writer::Begin() {
  Impl& m = *impl_;
  if (m.phase != Impl::Phase::kDeclaring) {
    return m.Usage(std::nullopt, "Begin once, after every Add", "Begin called twice");
  }
  if (!m.declare_error.ok()) return m.FailWith(m.declare_error);
  for (const auto& [k, v] : m.metadata) {
    if (FindInvalidUtf8(k) || FindInvalidUtf8(v) || k.empty()) {
      return m.FailWith(m.Usage(std::nullopt, "__metadata__ keys and values are UTF-8 text",
                                "metadata key " + PrintableName(k) + " cannot be written"));
    }
  }
  NameTable names;
  names.Reserve(m.tensors.size());
  for (const TensorInfo& t : m.tensors) {
    if (names.Insert(t.name) != NameTable::kAbsent) {
      return m.FailWith(m.Usage(t.name, "no duplicate tensor names", "declared twice"));
    }
  }
  const std::string& header = m.Header();
  if (header.size() > kMaxHeaderBytes) {
    return m.FailWith(m.Usage(std::nullopt, "the header is at most 100,000,000 bytes",
                              "the header would be " + std::to_string(header.size()) +
                                  " bytes; split the tensors over more shards"));
  }
  Result<std::unique_ptr<File>> opened = m.env->Open(m.tmp_path, OpenMode::kCreate);
  if (!opened.ok()) return m.FailWith(opened.status());
  m.file = std::move(opened).value();
  m.temp_created = true;
  m.out = std::make_unique<BufferedWriter>(m.file.get(), 0);
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  Status s = m.out->Append(prefix, sizeof prefix);
  if (s.ok()) s = m.out->Append(header.data(), header.size());
  if (!s.ok()) return m.FailWith(s);
  m.phase = Impl::Phase::kWriting;
  return Status::Ok();
}

Status Writer::Append(const void* data, size_t n) {
  Impl& m = *impl_;
  if (m.phase != Impl::Phase::kWriting) {
    return m.Usage(std::nullopt, "Append between Begin and Finish",
                   "Append while the writer is not writing");
  }
  if (n > m.data_bytes - m.appended) {
    return m.FailWith(m.Usage(m.NameAt(m.data_bytes), "exactly the declared bytes are appended",
                              "Append of " + std::to_string(n) + " bytes at data byte " +
                                  std::to_string(m.appended) + " goes past the declared " +
                                  std::to_string(m.data_bytes) + " data bytes"));
  }
  const Status s = m.out->Append(data, n);
  if (!s.ok()) {
    const std::optional<std::string_view> t = m.NameAt(m.appended);
    return m.FailWith(s.WithContext("writing tensor " + (t ? PrintableName(*t) : "?")));
  }
  m.appended += n;
  return Status::Ok();
}

Status Writer::Finish() {
  Impl& m = *impl_;
  if (m.phase != Impl::Phase::kWriting) {
    return m.Usage(std::nullopt, "Finish after Begin", "Finish while the writer is not writing");
  }
  if (m.appended != m.data_bytes) {
    const TensorInfo* t = m.TensorAt(m.appended);
    return m.FailWith(m.Usage(t->name, "exactly the declared bytes are appended",
                              "received " + std::to_string(m.appended - t->begin) + " of its " +
                                  std::to_string(t->nbytes()) + " bytes (" +
                                  std::to_string(m.data_bytes - m.appended) +
                                  " data bytes missing in total)"));
  }
  Status s = m.out->Flush();
  if (s.ok()) s = m.file->Sync();
  if (s.ok()) s = m.file->Close();
  if (s.ok()) s = m.env->Rename(m.tmp_path, m.path);
  if (!s.ok()) return m.FailWith(s);
  m.temp_created = false;
  m.out.reset();
  m.file.reset();
  m.phase = Impl::Phase::kFinished;
  return m.env->SyncDir(ParentDirOf(m.path));
}

void Writer::Abandon() {
  if (impl_->phase != Impl::Phase::kFinished) impl_->Discard();
}

}  // namespace k3::st
