// The start-up verdict of a scale-out run (k3run/mpi/handshake.h): every refusal, with both
// sides named; identities survive their encoding.
#include "k3run/mpi/handshake.h"

#include <gtest/gtest.h>

namespace k3::run::mpi {
namespace {

RankIdentity Rank(int r) {
  RankIdentity id;
  id.rank = r;
  id.host = "host" + std::to_string(r);
  id.pid = 100 + r;
  id.binary = "b1";
  id.prepared = "/data/k3-" + std::to_string(r);
  id.model = "m1";
  id.n_experts = 8;
  return id;
}

std::vector<RankIdentity> Ranks(int n) {
  std::vector<RankIdentity> all;
  for (int r = 0; r < n; ++r) all.push_back(Rank(r));
  return all;
}

void ExpectRefusal(const std::vector<RankIdentity>& ids, const std::vector<std::string>& needles) {
  const std::string v = Verdict(ids);
  ASSERT_FALSE(v.empty());
  for (const std::string& n : needles) EXPECT_NE(v.find(n), std::string::npos) << v;
}

TEST(MpiHandshake, MatchingRanksStart) {
  EXPECT_EQ(Verdict(Ranks(1)), "");
  EXPECT_EQ(Verdict(Ranks(4)), "");
  std::vector<RankIdentity> shares = Ranks(3);
  for (RankIdentity& id : shares) {
    id.share_ranks = 3;
    id.share_rank = id.rank;
  }
  EXPECT_EQ(Verdict(shares), "");
}

TEST(MpiHandshake, AnotherModelIsRefusedNamingBoth) {
  std::vector<RankIdentity> ids = Ranks(3);
  ids[2].model = "m2";
  ExpectRefusal(ids, {"rank 2 (host2, /data/k3-2)", "another model", "rank 0 (host0, /data/k3-0)"});
}

TEST(MpiHandshake, AnotherBinaryIsRefused) {
  std::vector<RankIdentity> ids = Ranks(2);
  ids[1].binary = "b2";
  ExpectRefusal(ids, {"rank 1", "another k3run binary", "b2", "b1"});
}

TEST(MpiHandshake, AnotherRanksShareIsRefused) {
  std::vector<RankIdentity> ids = Ranks(2);
  ids[1].share_ranks = 2;
  ids[1].share_rank = 0;
  ExpectRefusal(ids, {"holds the share of rank 0 of 2", "runs as rank 1 of 2",
                      "--ranks 2 --rank 1"});
  ids[1].share_ranks = 4;
  ids[1].share_rank = 1;
  ExpectRefusal(ids, {"rank 1 of 4", "runs as rank 1 of 2"});
}

TEST(MpiHandshake, ARankWhoseDirectoryFailedToOpenIsNamed) {
  std::vector<RankIdentity> ids = Ranks(3);
  ids[1].error = "k3.json altered";
  ExpectRefusal(ids, {"rank 1 (host1, /data/k3-1): k3.json altered"});
}

TEST(MpiHandshake, MoreRanksThanExpertsIsRefused) {
  ExpectRefusal(Ranks(9), {"mpirun -np"});
}

TEST(MpiHandshake, IdentityEncodingRoundTrips) {
  RankIdentity id = Rank(3);
  id.share_ranks = 4;
  id.share_rank = 3;
  id.error = "bad \"quoted\" \xff byte";
  Result<RankIdentity> back = DecodeIdentity(EncodeIdentity(id));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->host, "host3");
  EXPECT_EQ(back->pid, 103);
  EXPECT_EQ(back->share_ranks, 4);
  EXPECT_EQ(back->model, "m1");
  EXPECT_EQ(back->error.substr(0, 13), "bad \"quoted\" ");
  EXPECT_FALSE(DecodeIdentity("{").ok());
  EXPECT_FALSE(DecodeIdentity("{\"rank\": 1}").ok());
}

}  // namespace
}  // namespace k3::run::mpi
