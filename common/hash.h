// Hashing: XXH3 (64 and 128 bit, our own manifests and expert records), SHA-256 (where the
// Hub's published LFS oids must match) and SHA-1 (git blob ids of files the Hub keeps in git).
//
// XXH3 goes through xxHash's x86 dispatcher (xxh_x86dispatch.h; Debian's libxxhash ships the
// *_dispatch symbols), so AVX2/AVX-512 is used when the CPU has it without building k3 for
// that CPU. SHA-256 and SHA-1 use OpenSSL EVP (SHA-NI when available); every EVP call is
// checked, and a failing one (libcrypto itself broken, which no input can cause) aborts with a
// message naming the digest and the step.
//
// Thread safety: the stream objects are not shared between threads; the free functions are
// reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/env.h"
#include "common/status.h"

namespace k3 {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  // 32 lowercase hex digits, XXH128 canonical form (big-endian: high word first).
  std::string Hex() const;
  // Parses Hex() output; false on anything else (length, case, non-hex).
  static bool FromHex(const std::string& hex, Hash128* out);
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

// 16 lowercase hex digits, big-endian (XXH64 canonical form).
std::string Hex64(uint64_t v);

class Xxh3_128Stream {
 public:
  Xxh3_128Stream();
  ~Xxh3_128Stream();
  Xxh3_128Stream(const Xxh3_128Stream&) = delete;
  Xxh3_128Stream& operator=(const Xxh3_128Stream&) = delete;
  void Update(const void* data, size_t n);
  Hash128 Digest() const;  // may be called repeatedly; Update may continue afterwards

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class Xxh3_64Stream {
 public:
  Xxh3_64Stream();
  ~Xxh3_64Stream();
  Xxh3_64Stream(const Xxh3_64Stream&) = delete;
  Xxh3_64Stream& operator=(const Xxh3_64Stream&) = delete;
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

Hash128 Xxh3_128(const void* data, size_t n);
uint64_t Xxh3_64(const void* data, size_t n);

class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  // 64 lowercase hex digits. Finalises a copy, so Update may continue afterwards.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha256Hex(const void* data, size_t n);

// SHA-1, only to compare with an id someone else published (git blob ids): SHA-1 is broken for
// collision resistance, so k3 never chooses it for its own integrity checks.
class Sha1Stream {
 public:
  Sha1Stream();
  ~Sha1Stream();
  Sha1Stream(const Sha1Stream&) = delete;
  Sha1Stream& operator=(const Sha1Stream&) = delete;
  void Update(const void* data, size_t n);
  // 40 lowercase hex digits. Finalises a copy, so Update may continue afterwards.
  std::string HexDigest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha1Hex(const void* data, size_t n);

// Whole-file hashes, reading through `env` in large sequential chunks.
Result<Hash128> Xxh3_128File(Env* env, const std::string& path);
Result<std::string> Sha256File(Env* env, const std::string& path);

}  // namespace k3
