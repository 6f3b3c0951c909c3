#include "common/hash.h"

#include <openssl/evp.h>
// The dispatcher header renames XXH3_64bits, XXH3_128bits and their update functions to the
// runtime-dispatched *_dispatch symbols exported by Debian's libxxhash.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/hex.h"

namespace k3 {
namespace {

// One OpenSSL EVP digest stream. Every EVP call is checked; a failure means libcrypto itself is
// broken (no provider for the algorithm, its own allocation failing), which no input can cause,
// so it is reported and the process aborts (a bug, not a Status).
class EvpDigest {
 public:
  EvpDigest(const EVP_MD* md, const char* name) : ctx_(EVP_MD_CTX_new()), name_(name) {
    if (ctx_ == nullptr) Fail("allocating a context");
    if (md == nullptr || EVP_DigestInit_ex(ctx_, md, nullptr) != 1) Fail("initialising");
  }
  ~EvpDigest() { EVP_MD_CTX_free(ctx_); }
  EvpDigest(const EvpDigest&) = delete;
  EvpDigest& operator=(const EvpDigest&) = delete;

  void Update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx_, data, n) != 1) Fail("hashing");
  }
  // Lowercase hex of the digest so far; finalises a copy, so Update may continue afterwards.
  std::string HexDigest() const {
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> copy(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (copy == nullptr || EVP_MD_CTX_copy_ex(copy.get(), ctx_) != 1) Fail("copying the state");
    if (EVP_DigestFinal_ex(copy.get(), md, &len) != 1) Fail("finalising");
    return HexEncode(md, len);
  }

 private:
  [[noreturn]] void Fail(const char* step) const {
    std::fprintf(stderr, "k3: OpenSSL %s failed %s\n", name_, step);
    std::abort();
  }

  EVP_MD_CTX* ctx_;
  const char* name_;
};

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
  return HexEncode(c.digest, sizeof(c.digest));
}

bool Hash128::FromHex(const std::string& hex, Hash128* out) {
  const std::string_view s = hex;
  uint64_t high = 0, low = 0;
  if (s.size() != 32 || !ParseHexUint(s.substr(0, 16), 16, &high) ||
      !ParseHexUint(s.substr(16), 16, &low)) {
    return false;
  }
  *out = Hash128{high, low};
  return true;
}

std::string Hex64(uint64_t v) { return HexUint(v, 16); }

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
  EvpDigest digest{EVP_sha256(), "SHA-256"};
};

Sha256Stream::Sha256Stream() : state_(std::make_unique<State>()) {}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::Update(const void* data, size_t n) { state_->digest.Update(data, n); }
std::string Sha256Stream::HexDigest() { return state_->digest.HexDigest(); }

std::string Sha256Hex(const void* data, size_t n) {
  Sha256Stream s;
  s.Update(data, n);
  return s.HexDigest();
}

struct Sha1Stream::State {
  EvpDigest digest{EVP_sha1(), "SHA-1"};
};

Sha1Stream::Sha1Stream() : state_(std::make_unique<State>()) {}
Sha1Stream::~Sha1Stream() = default;
void Sha1Stream::Update(const void* data, size_t n) { state_->digest.Update(data, n); }
std::string Sha1Stream::HexDigest() const { return state_->digest.HexDigest(); }

std::string Sha1Hex(const void* data, size_t n) {
  Sha1Stream s;
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
