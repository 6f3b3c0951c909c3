// The safetensors header reader: length prefix, UTF-8, then a SAX pass that builds the tensor
// list while enforcing the entry grammar, then the whole-file rules (unique names, contiguous
// coverage, data ends at end of file). The SAX handler never builds a DOM: a DOM would silently
// keep the last of two duplicate keys and would turn integers above 2^64−1 into doubles.
#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/printable.h"
#include "formats/safetensors.h"

namespace k3::st {
namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kHint =
    "; the shard is damaged or was not written by a safetensors writer: re-download or "
    "regenerate it";

// Bytes of the header JSON before data starts: [0, 8) is the length prefix.
constexpr uint64_t kPrefixBytes = 8;

uint64_t DecodeLE64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// Long names are shortened because a 4 KiB name would drown the rest of the message.
std::string PrintableName(std::string_view s) {
  constexpr size_t kMaxShown = 200;
  size_t n = std::min(s.size(), kMaxShown);
  while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  std::string out = "\"" + Printable(s.substr(0, n), "\"") + "\"";
  if (n < s.size()) out += "… (" + std::to_string(s.size()) + " bytes)";
  return out;
}

namespace {

// Bytes around `pos`, every non-ASCII or control byte shown as \xNN, starting at the opening
// quote of the string that holds `pos` when there is one nearby: enough to find a bad tensor
// name whose bytes cannot be printed as text.
std::string Snippet(std::string_view json, size_t pos) {
  const size_t lo = pos > 80 ? pos - 80 : 0;
  size_t start = pos;
  while (start > lo && json[start - 1] != '"') --start;
  if (start > 0 && json[start - 1] == '"') --start;
  const size_t stop = std::min(json.size(), pos + 16);
  std::string out;
  for (size_t i = start; i < stop; ++i) {
    const auto c = static_cast<unsigned char>(json[i]);
    if (c < 0x20 || c >= 0x7F || c == '\\') {
      AppendByteEscape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// One byte for a message: 'c' when printable, \xNN otherwise.
std::string ByteText(char ch) {
  const auto c = static_cast<unsigned char>(ch);
  std::string out;
  if (c >= 0x20 && c < 0x7F) {
    out = std::string("'") + ch + "'";
  } else {
    AppendByteEscape(out, c);
  }
  return out;
}

// "3 bytes", "1 byte".
std::string Count(uint64_t n, std::string_view noun) {
  return std::to_string(n) + " " + std::string(noun) + (n == 1 ? "" : "s");
}

// `shard: tensor "name": what happened (at file byte offset X) [rule: ...]; hint`.
// `where` says what the offset points at ("at": the offending byte; "entry at": the tensor's
// key, for rules about the entry as a whole).
Status Fail(const std::string& shard, std::optional<std::string_view> tensor,
            std::string_view rule, const std::string& detail,
            std::optional<uint64_t> file_offset = std::nullopt, std::string_view where = "at") {
  std::string msg = shard + ": ";
  if (tensor) msg += "tensor " + PrintableName(*tensor) + ": ";
  msg += detail;
  if (file_offset) {
    msg += " (";
    msg += where;
    msg += " file byte offset " + std::to_string(*file_offset) + ")";
  }
  msg += " [rule: ";
  msg += rule;
  msg += "]";
  msg += kHint;
  return Status::Invalid(std::move(msg));
}

// File offset of the nth (1-based) occurrence of the key `"name":` in the header (or of
// `"name"` when the writer put spaces before the colon), for messages only. Returns nullopt
// when the name was written with JSON escapes and so cannot be found verbatim.
std::optional<uint64_t> LocateKey(std::string_view json, std::string_view name, int nth) {
  std::string quoted;
  quoted.reserve(name.size() + 3);
  quoted += '"';
  quoted += name;
  quoted += "\":";
  for (const size_t len : {quoted.size(), quoted.size() - 1}) {
    const std::string_view needle(quoted.data(), len);
    size_t pos = 0;
    int found = 0;
    for (; found < nth; ++found) {
      pos = json.find(needle, found == 0 ? 0 : pos + 1);
      if (pos == std::string_view::npos) break;
    }
    if (found == nth) return kPrefixBytes + pos;
  }
  return std::nullopt;
}

// The SAX handler (nlohmann's SAX concept). Every callback returns false to stop the parse
// after recording the first broken rule in status_.
class HeaderSax {
 public:
  using json = nlohmann::json;

  HeaderSax(std::string_view text, const std::string& shard, Header* out)
      : text_(text), shard_(shard), out_(out) {}

  const Status& status() const { return status_; }

  bool null() { return WrongType("null"); }
  bool boolean(bool) { return WrongType("a boolean"); }
  bool binary(json::binary_t&) { return WrongType("binary data"); }
  bool number_integer(json::number_integer_t v) {
    // nlohmann reports a number as signed only when it carries a minus sign.
    return BadNumber("is negative (" + std::to_string(v) + ")");
  }
  bool number_float(json::number_float_t, const std::string& token) {
    return BadNumber("is " + token +
                     ", which is not an unsigned 64-bit integer (a fraction, an exponent or "
                     "a value above 2^64-1)");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ == State::kShape) {
      if (rank_ == kMaxRank) {
        return Error("rank is at most 8",
                     "shape has more than " + std::to_string(kMaxRank) + " dimensions");
      }
      dims_[rank_++] = v;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (n_offsets_ == 2) return Error(kOffsetsRule, "data_offsets has more than two numbers");
      offsets_[n_offsets_++] = v;
      return true;
    }
    return WrongType("a number");
  }
  bool string(std::string& s) {
    if (state_ == State::kMetaValue) {
      out_->metadata.emplace(std::move(meta_key_), s);
      state_ = State::kMetaKey;
      return true;
    }
    if (state_ == State::kEntryValue && field_ == kFieldDType) {
      const std::optional<DType> t = ParseDType(s);
      if (!t) {
        return Error("dtype is one of the supported dtypes",
                     "unknown dtype " + PrintableName(s) + " (supported: " +
                         std::string(SupportedDTypeList()) + ")");
      }
      cur_->dtype = *t;
      state_ = State::kEntryKey;
      return true;
    }
    return WrongType("a string");
  }
  bool start_object(std::size_t) {
    switch (state_) {
      case State::kBeforeTop: state_ = State::kTopKey; return true;
      case State::kTopValue:
        state_ = in_meta_ ? State::kMetaKey : State::kEntryKey;
        fields_seen_ = 0;
        return true;
      default: return WrongType("an object");
    }
  }
  bool end_object() {
    switch (state_) {
      case State::kTopKey: state_ = State::kDone; return true;
      case State::kMetaKey: state_ = State::kTopKey; return true;
      case State::kEntryKey: return FinishEntry();
      default: return Error("well-formed JSON", "unexpected end of object");
    }
  }
  bool start_array(std::size_t) {
    if (state_ == State::kEntryValue && field_ == kFieldShape) {
      state_ = State::kShape;
      rank_ = 0;
      return true;
    }
    if (state_ == State::kEntryValue && field_ == kFieldOffsets) {
      state_ = State::kOffsets;
      n_offsets_ = 0;
      return true;
    }
    return WrongType("an array");
  }
  bool end_array() {
    if (state_ == State::kShape) {
      cur_->shape.assign(dims_, dims_ + rank_);
      state_ = State::kEntryKey;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (n_offsets_ != 2) {
        return Error(kOffsetsRule,
                     "data_offsets has " + Count(n_offsets_, "number") + ", not two");
      }
      state_ = State::kEntryKey;
      return true;
    }
    return Error("well-formed JSON", "unexpected end of array");
  }
  bool key(std::string& k) {
    switch (state_) {
      case State::kTopKey: return TopKey(k);
      case State::kMetaKey:
        if (out_->metadata.count(k) != 0) {
          return Error("no duplicate keys", "__metadata__ has the key " + PrintableName(k) +
                                                " twice");
        }
        meta_key_ = k;
        state_ = State::kMetaValue;
        return true;
      case State::kEntryKey: return EntryKey(k);
      default: return Error("well-formed JSON", "unexpected key " + PrintableName(k));
    }
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." → from "parse".
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what.erase(0, bracket + 2);
    const uint64_t at = kPrefixBytes + (position > 0 ? position - 1 : 0);
    status_ = Fail(shard_, CurrentTensor(), "the header is one well-formed JSON object",
                   "JSON " + what, at);
    return false;
  }

 private:
  enum class State {
    kBeforeTop, kTopKey, kTopValue, kMetaKey, kMetaValue, kEntryKey, kEntryValue, kShape,
    kOffsets, kDone,
  };
  static constexpr unsigned kFieldDType = 1, kFieldShape = 2, kFieldOffsets = 4;
  static constexpr std::string_view kOffsetsRule =
      "data_offsets is [begin, end] of unsigned 64-bit integers";

  std::optional<std::string_view> CurrentTensor() const {
    if (cur_ == nullptr || in_meta_ || state_ == State::kTopKey || state_ == State::kDone) {
      return std::nullopt;
    }
    return std::string_view(cur_->name);
  }

  bool Error(std::string_view rule, const std::string& detail) {
    std::optional<uint64_t> at;
    if (const auto t = CurrentTensor()) at = LocateKey(text_, *t, 1);
    status_ = Fail(shard_, CurrentTensor(), rule, detail, at, "entry at");
    return false;
  }

  bool TopKey(const std::string& k) {
    if (k == kMetadataKey) {
      if (seen_meta_) {
        status_ = Fail(shard_, std::nullopt, "no duplicate keys",
                       "the header has the key __metadata__ twice",
                       LocateKey(text_, kMetadataKey, 2));
        return false;
      }
      seen_meta_ = in_meta_ = true;
      state_ = State::kTopValue;
      return true;
    }
    in_meta_ = false;
    if (k.empty()) {
      status_ = Fail(shard_, std::nullopt, "tensor names are non-empty",
                     "a tensor has an empty name", LocateKey(text_, "", 1));
      return false;
    }
    if (k.size() > kMaxNameBytes) {
      status_ = Fail(shard_, std::string_view(k), "tensor names are at most 4096 bytes",
                     "the name is " + std::to_string(k.size()) + " bytes long",
                     LocateKey(text_, k, 1));
      return false;
    }
    cur_ = &out_->tensors.emplace_back();
    cur_->name = k;
    state_ = State::kTopValue;
    return true;
  }

  bool EntryKey(const std::string& k) {
    if (k == "dtype") {
      field_ = kFieldDType;
    } else if (k == "shape") {
      field_ = kFieldShape;
    } else if (k == "data_offsets") {
      field_ = kFieldOffsets;
    } else {
      return Error("a tensor entry has only dtype, shape and data_offsets",
                   "unknown key " + PrintableName(k) + " in the tensor entry");
    }
    if ((fields_seen_ & field_) != 0) {
      return Error("no duplicate keys", "the entry has the key \"" + k + "\" twice");
    }
    fields_seen_ |= field_;
    state_ = State::kEntryValue;
    return true;
  }

  bool FinishEntry() {
    if (fields_seen_ != (kFieldDType | kFieldShape | kFieldOffsets)) {
      std::string missing;
      if ((fields_seen_ & kFieldDType) == 0) missing += "dtype ";
      if ((fields_seen_ & kFieldShape) == 0) missing += "shape ";
      if ((fields_seen_ & kFieldOffsets) == 0) missing += "data_offsets ";
      missing.pop_back();
      return Error("a tensor entry has dtype, shape and data_offsets",
                   "the entry lacks " + missing);
    }
    cur_->begin = offsets_[0];
    cur_->end = offsets_[1];
    if (cur_->end < cur_->begin) {
      return Error(kOffsetsRule, "data_offsets [" + std::to_string(cur_->begin) + ", " +
                                     std::to_string(cur_->end) + "] ends before it begins");
    }
    const std::optional<uint64_t> want = CheckedByteSize(cur_->dtype, cur_->shape);
    if (!want) {
      return Error("numel x dtype size fits in 64 bits",
                   "the element count of the shape times the dtype size overflows 64 bits");
    }
    if (cur_->end - cur_->begin != *want) {
      return Error("end - begin == numel x dtype size",
                   "data_offsets [" + std::to_string(cur_->begin) + ", " +
                       std::to_string(cur_->end) + "] hold " +
                       std::to_string(cur_->end - cur_->begin) + " bytes but " +
                       DTypeName(cur_->dtype) + " with " + std::to_string(cur_->numel()) +
                       " elements needs " + std::to_string(*want));
    }
    state_ = State::kTopKey;
    return true;
  }

  bool WrongType(const std::string& found) {
    switch (state_) {
      case State::kTopValue:
        if (in_meta_) {
          return Error("__metadata__ maps strings to strings",
                       "__metadata__ is " + found + ", not an object");
        }
        return Error("a tensor entry is an object of dtype, shape and data_offsets",
                     "the entry is " + found + ", not an object");
      case State::kMetaValue:
        return Error("__metadata__ maps strings to strings",
                     "__metadata__ value of " + PrintableName(meta_key_) + " is " + found +
                         ", not a string");
      case State::kEntryValue:
        if (field_ == kFieldDType) return Error("dtype is a string", "dtype is " + found);
        if (field_ == kFieldShape) {
          return Error("shape is an array of unsigned 64-bit integers", "shape is " + found);
        }
        return Error(kOffsetsRule, "data_offsets is " + found);
      case State::kShape:
        return Error("shape is an array of unsigned 64-bit integers",
                     "shape[" + std::to_string(rank_) + "] is " + found);
      case State::kOffsets:
        return Error(kOffsetsRule,
                     "data_offsets[" + std::to_string(n_offsets_) + "] is " + found);
      default: return Error("the header is one JSON object", "found " + found);
    }
  }

  bool BadNumber(const std::string& what) {
    if (state_ == State::kShape) {
      return Error("shape is an array of unsigned 64-bit integers",
                   "shape[" + std::to_string(rank_) + "] " + what);
    }
    if (state_ == State::kOffsets) {
      return Error(kOffsetsRule, "data_offsets[" + std::to_string(n_offsets_) + "] " + what);
    }
    return WrongType("a number");
  }

  std::string_view text_;
  const std::string& shard_;
  Header* out_;
  Status status_;
  State state_ = State::kBeforeTop;
  TensorInfo* cur_ = nullptr;
  bool in_meta_ = false;
  bool seen_meta_ = false;
  std::string meta_key_;
  unsigned field_ = 0;
  unsigned fields_seen_ = 0;
  // Dimensions collect here so each shape is one exact-size allocation.
  uint64_t dims_[kMaxRank] = {};
  size_t rank_ = 0;
  uint64_t offsets_[2] = {};
  size_t n_offsets_ = 0;
};

Status CheckUniqueNames(std::string_view json, const Header& h, const std::string& shard) {
  NameTable seen;
  seen.Reserve(h.tensors.size());
  for (const TensorInfo& t : h.tensors) {
    if (seen.Insert(t.name) != NameTable::kAbsent) {
      return Fail(shard, std::string_view(t.name), "no duplicate keys",
                  "the tensor name appears twice in the header", LocateKey(json, t.name, 2));
    }
  }
  return Status::Ok();
}

// Sorted by begin, the tensors must tile [0, data length) exactly: a hole would let a file
// smuggle unindexed bytes (a polyglot), an overlap would alias two tensors.
Status CheckCoverage(Header& h, const std::string& shard) {
  auto by_offsets = [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  };
  if (!std::is_sorted(h.tensors.begin(), h.tensors.end(), by_offsets)) {
    std::stable_sort(h.tensors.begin(), h.tensors.end(), by_offsets);
  }
  const uint64_t data_len = h.file_size - h.data_offset;
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin > cursor) {
      return Fail(shard, std::string_view(t.name),
                  "tensors cover the data section contiguously (no hole)",
                  "data bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
                      ") before this tensor belong to no tensor",
                  h.data_offset + cursor);
    }
    if (t.begin < cursor) {
      return Fail(shard, std::string_view(t.name),
                  "tensors cover the data section without overlap",
                  "begins at data byte " + std::to_string(t.begin) + ", inside tensor " +
                      PrintableName(prev->name) + " which ends at data byte " +
                      std::to_string(cursor),
                  h.data_offset + t.begin);
    }
    cursor = t.end;
    prev = &t;
  }
  if (cursor == data_len) return Status::Ok();
  if (cursor < data_len) {
    std::optional<std::string_view> last;
    if (prev != nullptr) last = prev->name;
    return Fail(shard, last, "the data section ends exactly at end of file",
                "the tensors end at data byte " + std::to_string(cursor) + " but the file has " +
                    Count(data_len - cursor, "more byte") + " after it",
                h.data_offset + cursor);
  }
  const TensorInfo* crossing = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.end > data_len) {
      crossing = &t;
      break;
    }
  }
  return Fail(shard, std::string_view(crossing->name),
              "the data section ends exactly at end of file",
              "data_offsets end at data byte " + std::to_string(crossing->end) +
                  " but the file has only " + std::to_string(data_len) +
                  " data bytes (file truncated?)",
              h.file_size);
}

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::optional<uint64_t> CheckedByteSize(DType dtype, const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  if (__builtin_mul_overflow(n, uint64_t{DTypeSize(dtype)}, &n)) return std::nullopt;
  return n;
}

std::optional<size_t> FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Headers are almost all ASCII: skip eight bytes at a time while no high bit is set.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07u;
    } else {
      return i;  // a continuation byte, an overlong 2-byte lead (C0, C1) or F5..FF
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned cc = p[i + k];
      if ((cc & 0xC0u) != 0x80u) return i;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return i;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return i;
    i += len;
  }
  return std::nullopt;
}

Status CheckHeaderLength(uint64_t header_len, uint64_t file_size, const std::string& shard) {
  if (header_len > kMaxHeaderBytes) {
    return Fail(shard, std::nullopt, "the header is at most 100,000,000 bytes",
                "the length prefix says the header is " + std::to_string(header_len) +
                    " bytes",
                0);
  }
  if (file_size < kPrefixBytes || header_len > file_size - kPrefixBytes) {
    return Fail(shard, std::nullopt, "8 + header length <= file size",
                "the length prefix says the header is " + std::to_string(header_len) +
                    " bytes but the file is only " + std::to_string(file_size) +
                    " bytes (file truncated?)",
                0);
  }
  return Status::Ok();
}

Result<Header> ParseHeader(std::string_view json, uint64_t file_size, const std::string& shard) {
  K3_RETURN_IF_ERROR(CheckHeaderLength(json.size(), file_size, shard));
  if (json.empty() || json[0] != '{') {
    return Fail(shard, std::nullopt, "the header starts with '{'",
                json.empty() ? std::string("the header is empty")
                             : "the header starts with " + ByteText(json[0]),
                kPrefixBytes);
  }
  if (const std::optional<size_t> bad = FindInvalidUtf8(json)) {
    return Fail(shard, std::nullopt, "the header is valid UTF-8",
                "invalid UTF-8 byte in the header, near: " + Snippet(json, *bad),
                kPrefixBytes + *bad);
  }
  // Writers pad the header with spaces so that the data section is aligned.
  size_t end = json.size();
  while (end > 0 && json[end - 1] == ' ') --end;
  if (json[end - 1] != '}') {
    return Fail(shard, std::nullopt, "only spaces (0x20) may follow the header's JSON object",
                "the last byte before any space padding is " + ByteText(json[end - 1]) +
                    ", not '}'",
                kPrefixBytes + end - 1);
  }

  Header h;
  h.header_len = json.size();
  h.data_offset = kPrefixBytes + json.size();
  h.file_size = file_size;
  // Real entries are ~150 bytes; one reservation avoids most regrowth on big headers.
  h.tensors.reserve(json.size() / 128 + 1);
  HeaderSax sax(json, shard, &h);
  const bool parsed = nlohmann::json::sax_parse(json.data(), json.data() + end, &sax,
                                                nlohmann::json::input_format_t::json,
                                                /*strict=*/true, /*ignore_comments=*/false);
  if (!parsed) {
    if (!sax.status().ok()) return sax.status();
    return Fail(shard, std::nullopt, "the header is one well-formed JSON object",
                "the JSON parser stopped without a reason");
  }
  K3_RETURN_IF_ERROR(CheckUniqueNames(json, h, shard));
  K3_RETURN_IF_ERROR(CheckCoverage(h, shard));
  return h;
}

Result<Header> ParseFileBytes(std::string_view file, const std::string& shard) {
  if (file.size() < kPrefixBytes) {
    return Fail(shard, std::nullopt, "a file starts with an 8-byte header length",
                "the file is only " + std::to_string(file.size()) + " bytes");
  }
  const uint64_t n = DecodeLE64(reinterpret_cast<const unsigned char*>(file.data()));
  K3_RETURN_IF_ERROR(CheckHeaderLength(n, file.size(), shard));
  return ParseHeader(file.substr(kPrefixBytes, static_cast<size_t>(n)), file.size(), shard);
}

Result<Header> ReadHeader(Env* env, const std::string& path, std::string* scratch) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  if (size < kPrefixBytes) {
    return Fail(path, std::nullopt, "a file starts with an 8-byte header length",
                "the file is only " + std::to_string(size) + " bytes");
  }
  unsigned char prefix[kPrefixBytes];
  K3_RETURN_IF_ERROR(file->ReadExact(0, kPrefixBytes, prefix));
  const uint64_t n = DecodeLE64(prefix);
  K3_RETURN_IF_ERROR(CheckHeaderLength(n, size, path));
  std::string local;
  std::string& json = scratch != nullptr ? *scratch : local;
  json.resize(static_cast<size_t>(n));
  K3_RETURN_IF_ERROR(file->ReadExact(kPrefixBytes, json.size(), json.data()));
  return ParseHeader(json, size, path);
}

}  // namespace k3::st
