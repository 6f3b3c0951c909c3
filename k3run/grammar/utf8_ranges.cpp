#include "k3run/grammar/utf8_ranges.h"

#include <algorithm>
#include <cassert>

namespace k3::run::grammar {
namespace {

int EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::array<uint8_t, 4> Encode(uint32_t cp) {
  std::vector<uint8_t> bytes;
  AppendUtf8(cp, &bytes);
  std::array<uint8_t, 4> out{};
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return out;
}

// The splitting of Rust's utf8-ranges (regex-syntax): first at the encoded-length boundaries,
// then until lo and hi differ only in trailing 6-bit groups that span their full range, where
// the byte-wise ranges [enc(lo)[i], enc(hi)[i]] describe exactly [lo, hi].
void Split(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  for (const uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && max < hi) {
      Split(lo, max, out);
      Split(max + 1, hi, out);
      return;
    }
  }
  const int length = EncodedLength(lo);
  for (int i = 1; i < length; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Split(lo, lo | m, out);
        Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Split(lo, (hi & ~m) - 1, out);
        Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  ByteRangeSeq seq;
  seq.length = length;
  seq.lo = Encode(lo);
  seq.hi = Encode(hi);
  out->push_back(seq);
}

}  // namespace

void AppendUtf8(uint32_t cp, std::vector<uint8_t>* out) {
  assert(cp <= kMaxCodePoint && (cp < kSurrogateLo || cp > kSurrogateHi));
  if (cp < 0x80) {
    out->push_back(static_cast<uint8_t>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<uint8_t>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<uint8_t>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<uint8_t>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Of(uint32_t cp) {
  std::vector<uint8_t> bytes;
  AppendUtf8(cp, &bytes);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint32_t> CodePointsOf(std::string_view utf8) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t k = 1; k < n && i + k < utf8.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3Fu);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::vector<CodePointRange> NormalizeClass(std::vector<CodePointRange> ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  std::vector<CodePointRange> merged;
  for (const CodePointRange& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (negate) {
    std::vector<CodePointRange> complement;
    uint32_t next = 0;
    for (const CodePointRange& r : merged) {
      if (r.lo > next) complement.push_back({next, r.lo - 1});
      next = r.hi + 1;
    }
    if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
    merged = std::move(complement);
  }
  std::vector<CodePointRange> out;
  for (const CodePointRange& r : merged) {
    if (r.hi < kSurrogateLo || r.lo > kSurrogateHi) {
      out.push_back(r);
      continue;
    }
    if (r.lo < kSurrogateLo) out.push_back({r.lo, kSurrogateLo - 1});
    if (r.hi > kSurrogateHi) out.push_back({kSurrogateHi + 1, r.hi});
  }
  return out;
}

std::vector<ByteRangeSeq> Utf8Sequences(const std::vector<CodePointRange>& ranges) {
  std::vector<ByteRangeSeq> out;
  for (const CodePointRange& r : ranges) Split(r.lo, r.hi, &out);
  return out;
}

}  // namespace k3::run::grammar
