// Hashes against published test vectors (FIPS 180-2 for SHA-256; xxHash's own sanity vectors,
// cli/xsum_sanity_check.c, for XXH3), and streaming == one-shot over random chunkings.
#include "common/hash.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace k3 {
namespace {

// xxHash's sanity buffer: byte i is the top byte of PRIME32 · PRIME64^i (mod 2^64).
std::vector<uint8_t> SanityBuffer(size_t n) {
  std::vector<uint8_t> buf(n);
  uint64_t gen = 2654435761ULL;
  for (size_t i = 0; i < n; ++i) {
    buf[i] = static_cast<uint8_t>(gen >> 56);
    gen *= 0x9E3779B185EBCA8DULL;
  }
  return buf;
}

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(Sha256Hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, MillionAs) {
  Sha256Stream s;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) s.Update(chunk.data(), chunk.size());
  EXPECT_EQ(s.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// FIPS 180 test vectors ("abc", the empty message, the two-block message, a million 'a').
TEST(Sha1, FipsVectors) {
  EXPECT_EQ(Sha1Hex("abc", 3), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(Sha1Hex("", 0), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(Sha1Hex(two_blocks.data(), two_blocks.size()),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
}

TEST(Sha1, MillionAsStreamedAndDigestDoesNotEndTheStream) {
  Sha1Stream s;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 500; ++i) s.Update(chunk.data(), chunk.size());
  EXPECT_EQ(s.HexDigest(), Sha1Hex(std::string(500000, 'a').data(), 500000));
  for (int i = 0; i < 500; ++i) s.Update(chunk.data(), chunk.size());
  EXPECT_EQ(s.HexDigest(), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

// What k3prep download compares with a listing's oid: git's blob id, SHA-1 of "blob <size>\0"
// followed by the bytes (git hash-object).
TEST(Sha1, GitBlobId) {
  const std::string blob = std::string("blob 6") + '\0' + "hello\n";
  EXPECT_EQ(Sha1Hex(blob.data(), blob.size()), "ce013625030ba8dba906f756967f9e9ca394464a");
}

TEST(Xxh3_64, SanityVectors) {
  const auto buf = SanityBuffer(2367);
  const struct {
    size_t len;
    uint64_t want;
  } cases[] = {
      {0, 0x2D06800538D394C2ULL},    {1, 0xC44BDFF4074EECDBULL},    {6, 0x27B56A84CD2D7325ULL},
      {12, 0xA713DAF0DFBB77E7ULL},   {24, 0xA3FE70BF9D3510EBULL},   {48, 0x397DA259ECBA1F11ULL},
      {80, 0xBCDEFBBB2C47C90AULL},   {195, 0xCD94217EE362EC3AULL},  {403, 0xCDEB804D65C6DEA4ULL},
      {512, 0x617E49599013CB6BULL},  {2048, 0xDD59E2C3A5F038E0ULL}, {2240, 0x6E73A90539CF2948ULL},
      {2367, 0xCB37AEB9E5D361EDULL},
  };
  for (const auto& c : cases) EXPECT_EQ(Xxh3_64(buf.data(), c.len), c.want) << "len " << c.len;
  EXPECT_EQ(Hex64(0x2D06800538D394C2ULL), "2d06800538d394c2");
}

TEST(Xxh3_128, SanityVectors) {
  const auto buf = SanityBuffer(2367);
  const struct {
    size_t len;
    uint64_t low, high;
  } cases[] = {
      {0, 0x6001C324468D497FULL, 0x99AA06D3014798D8ULL},
      {1, 0xC44BDFF4074EECDBULL, 0xA6CD5E9392000F6AULL},
      {6, 0x3E7039BDDA43CFC6ULL, 0x082AFE0B8162D12AULL},
      {12, 0x061A192713F69AD9ULL, 0x6E3EFD8FC7802B18ULL},
      {24, 0x1E7044D28B1B901DULL, 0x0CE966E4678D3761ULL},
      {48, 0xF942219AED80F67BULL, 0xA002AC4E5478227EULL},
      {81, 0x5E8BAFB9F95FB803ULL, 0x4952F58181AB0042ULL},
      {222, 0xF1AEBD597CEC6B3AULL, 0x337E09641B948717ULL},
      {403, 0xCDEB804D65C6DEA4ULL, 0x1B6DE21E332DD73DULL},
      {512, 0x617E49599013CB6BULL, 0x18D2D110DCC9BCA1ULL},
      {2048, 0xDD59E2C3A5F038E0ULL, 0xF736557FD47073A5ULL},
      {2240, 0x6E73A90539CF2948ULL, 0xCCB134FBFA7CE49DULL},
      {2367, 0xCB37AEB9E5D361EDULL, 0xE89C0F6FF369B427ULL},
  };
  for (const auto& c : cases) {
    const Hash128 h = Xxh3_128(buf.data(), c.len);
    EXPECT_EQ(h.low, c.low) << "len " << c.len;
    EXPECT_EQ(h.high, c.high) << "len " << c.len;
  }
}

TEST(Xxh3_128, HexIsCanonicalBigEndian) {
  EXPECT_EQ(Xxh3_128(nullptr, 0).Hex(), "99aa06d3014798d86001c324468d497f");
  Hash128 parsed;
  ASSERT_TRUE(Hash128::FromHex("99aa06d3014798d86001c324468d497f", &parsed));
  EXPECT_EQ(parsed, Xxh3_128(nullptr, 0));
  EXPECT_FALSE(Hash128::FromHex("99AA06D3014798D86001C324468D497F", &parsed)) << "uppercase";
  EXPECT_FALSE(Hash128::FromHex("99aa06d3014798d86001c324468d497", &parsed)) << "31 digits";
  EXPECT_FALSE(Hash128::FromHex("99aa06d3014798d86001c324468d497g", &parsed)) << "non-hex";
}

// Splits `data` at random points and feeds the pieces to `update`.
template <typename Fn>
void FeedRandomChunks(const std::vector<uint8_t>& data, uint32_t seed, Fn&& update) {
  std::mt19937 rng(seed);
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t max = (rng() % 4 == 0) ? 5000 : 70;
    const size_t n = std::min<size_t>(data.size() - pos, rng() % (max + 1));
    update(data.data() + pos, n);
    pos += n;
  }
}

TEST(HashStreams, StreamingEqualsOneShotOverRandomChunkings) {
  std::mt19937 rng(7);
  for (size_t size : {0u, 1u, 17u, 240u, 241u, 1024u, 100000u}) {
    std::vector<uint8_t> data(size);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Xxh3_64Stream s64;
      Xxh3_128Stream s128;
      Sha256Stream sha;
      FeedRandomChunks(data, seed, [&](const void* p, size_t n) {
        s64.Update(p, n);
        s128.Update(p, n);
        sha.Update(p, n);
      });
      EXPECT_EQ(s64.Digest(), Xxh3_64(data.data(), size)) << size;
      EXPECT_EQ(s128.Digest(), Xxh3_128(data.data(), size)) << size;
      EXPECT_EQ(sha.HexDigest(), Sha256Hex(data.data(), size)) << size;
    }
  }
}

TEST(HashStreams, DigestDoesNotEndTheStream) {
  Sha256Stream sha;
  sha.Update("ab", 2);
  (void)sha.HexDigest();
  sha.Update("c", 1);
  EXPECT_EQ(sha.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Xxh3_128Stream x;
  x.Update("ab", 2);
  (void)x.Digest();
  x.Update("c", 1);
  EXPECT_EQ(x.Digest(), Xxh3_128("abc", 3));
}

TEST(HashFiles, FileHashesEqualInMemoryHashes) {
  test::TempDir dir;
  std::string data(9u << 20, '\0');  // more than one read chunk
  std::mt19937 rng(3);
  for (char& c : data) c = static_cast<char>(rng());
  const std::string path = dir.WriteFile("f", data);
  auto x = Xxh3_128File(Env::Default(), path);
  auto s = Sha256File(Env::Default(), path);
  ASSERT_TRUE(x.ok() && s.ok());
  EXPECT_EQ(*x, Xxh3_128(data.data(), data.size()));
  EXPECT_EQ(*s, Sha256Hex(data.data(), data.size()));
}

TEST(HashFiles, MissingFileIsInvalid) {
  test::TempDir dir;
  auto x = Xxh3_128File(Env::Default(), dir.Join("missing"));
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status().code(), Code::kInvalid);
  EXPECT_NE(x.status().message().find("missing: no such file"), std::string::npos);
}

}  // namespace
}  // namespace k3
