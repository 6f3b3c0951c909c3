#include "common/hash.h"

#include <openssl/evp.h>
// The dispatcher header renames XXH3_64bits, XXH3_128bits and their update functions to the
// runtime-dispatched *_dispatch symbols exported by Debian's libxxhash.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace k3 {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

void AppendHex(const unsigned char* bytes, size_t n, std::string* out) {
  for (size_t i = 0; i < n; ++i) {
    out->push_back(kHexDigits[bytes[i] >> 4]);
    out->push_back(kHexDigits[bytes[i] & 15]);
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

Hash128 FromXxh(XXH128_hash_t h) { return Hash128{h.high64, h.low64}; }

// Large sequential reads: the page cache and readahead do the rest.
constexpr size_t kFileChunk = 8 << 20;

template <typename Fn>
Status ForEachChunk(Env* env, const std::string& path, Fn&& fn) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::vector<unsigned char> buf(kFileChunk);
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kFileChunk, size - off));
    K3_RETURN_IF_ERROR(file->ReadExact(off, n, buf.data()));
    fn(buf.data(), n);
    off += n;
  }
  return Status::Ok();
}

}  // namespace

std::string Hash128::Hex() const {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH128_hash_t{low, high});
  std::string out;
  out.reserve(32);
  AppendHex(c.digest, sizeof(c.digest), &out);
  return out;
}

bool Hash128::FromHex(const std::string& hex, Hash128* out) {
  if (hex.size() != 32) return false;
  uint64_t words[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const int v = HexValue(hex[i]);
    if (v < 0) return false;
    words[i / 16] = (words[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  *out = Hash128{words[0], words[1]};
  return true;
}

std::string Hex64(uint64_t v) {
  XXH64_canonical_t c;
  XXH64_canonicalFromHash(&c, v);
  std::string out;
  AppendHex(c.digest, sizeof(c.digest), &out);
  return out;
}

struct Xxh3_128Stream::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Xxh3_128Stream::Xxh3_128Stream() : state_(std::make_unique<State>()) {
  XXH3_128bits_reset(state_->s);
}
Xxh3_128Stream::~Xxh3_128Stream() = default;
void Xxh3_128Stream::Update(const void* data, size_t n) {
  XXH3_128bits_update(state_->s, data, n);
}
Hash128 Xxh3_128Stream::Digest() const { return FromXxh(XXH3_128bits_digest(state_->s)); }

struct Xxh3_64Stream::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Xxh3_64Stream::Xxh3_64Stream() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(state_->s);
}
Xxh3_64Stream::~Xxh3_64Stream() = default;
void Xxh3_64Stream::Update(const void* data, size_t n) { XXH3_64bits_update(state_->s, data, n); }
uint64_t Xxh3_64Stream::Digest() const { return XXH3_64bits_digest(state_->s); }

Hash128 Xxh3_128(const void* data, size_t n) { return FromXxh(XXH3_128bits(data, n)); }
uint64_t Xxh3_64(const void* data, size_t n) { return XXH3_64bits(data, n); }

struct Sha256Stream::State {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~State() { EVP_MD_CTX_free(ctx); }
};

Sha256Stream::Sha256Stream() : state_(std::make_unique<State>()) {
  // Failure here means libcrypto itself is broken (no SHA-256 provider): a bug, not input.
  if (state_->ctx == nullptr || EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1) {
    std::fputs("k3: OpenSSL cannot initialise SHA-256\n", stderr);
    std::abort();
  }
}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::Update(const void* data, size_t n) {
  EVP_DigestUpdate(state_->ctx, data, n);
}
std::string Sha256Stream::HexDigest() {
  EVP_MD_CTX* copy = EVP_MD_CTX_new();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (copy == nullptr || EVP_MD_CTX_copy_ex(copy, state_->ctx) != 1 ||
      EVP_DigestFinal_ex(copy, md, &len) != 1) {
    std::fputs("k3: OpenSSL SHA-256 finalisation failed\n", stderr);
    std::abort();
  }
  EVP_MD_CTX_free(copy);
  std::string out;
  AppendHex(md, len, &out);
  return out;
}

std::string Sha256Hex(const void* data, size_t n) {
  Sha256Stream s;
  s.Update(data, n);
  return s.HexDigest();
}

Result<Hash128> Xxh3_128File(Env* env, const std::string& path) {
  Xxh3_128Stream h;
  K3_RETURN_IF_ERROR(ForEachChunk(env, path, [&](const void* p, size_t n) { h.Update(p, n); }));
  return h.Digest();
}

Result<std::string> Sha256File(Env* env, const std::string& path) {
  Sha256Stream h;
  K3_RETURN_IF_ERROR(ForEachChunk(env, path, [&](const void* p, size_t n) { h.Update(p, n); }));
  return h.HexDigest();
}

}  // namespace k3
