// Image rows in a sequence (k3run/engine/media.h): the rows of a span replace exactly the pads
// fed at its positions, bit for bit (a span whose rows are the embedding rows of tokens X, Y
// gives the logits of feeding X, Y), in one pass, chunked, or row by row; pads outside every
// span keep their embedding; the engine refuses spans it cannot bind.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "k3run/engine/session.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run {
namespace {

using testing::SpanOfTokens;
using testing::TinyPreparedDir;

std::unique_ptr<Engine> Tiny() {
  return testing::OpenPlanned(TinyPreparedDir(), testing::ContextPlan(32));
}

// Logits of every row of `ids`, fed in pieces of `piece` rows, with `spans` attached first.
std::vector<float> Feed(Engine* e, const std::vector<int32_t>& ids, std::vector<MediaSpan> spans,
                        size_t piece) {
  std::unique_ptr<Sequence> seq = e->NewSequence();
  EXPECT_TRUE(e->AttachMedia(seq.get(), std::move(spans)).ok());
  std::vector<float> out;
  for (size_t at = 0; at < ids.size(); at += piece) {
    const size_t n = std::min(piece, ids.size() - at);
    std::vector<StepInput> in{
        {seq.get(), std::vector<int32_t>(ids.begin() + at, ids.begin() + at + n), Logits::kAll}};
    Result<StepResult> r = e->Step(in);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    out.insert(out.end(), r->logits.begin(), r->logits.end());
    EXPECT_TRUE(e->Commit(seq.get(), static_cast<int64_t>(n)).ok());
  }
  return out;
}

TEST(MediaRows, SpanRowsReplaceThePadsBitForBit) {
  std::unique_ptr<Engine> e = Tiny();
  ASSERT_NE(e, nullptr);
  const auto pad = static_cast<int32_t>(e->config().media_placeholder_token_id);
  ASSERT_GT(pad, 0);
  const std::vector<int32_t> plain = {3, 7, 300, 42, 11, 5};
  const std::vector<int32_t> padded = {3, 7, pad, pad, 11, 5};
  const std::vector<float> want = Feed(e.get(), plain, {}, plain.size());
  for (size_t piece : {size_t{6}, size_t{3}, size_t{1}}) {
    const std::vector<float> got =
        Feed(e.get(), padded, {SpanOfTokens(e.get(), {300, 42}, 2)}, piece);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << "pieces of " << piece;
  }
  // Without the span the pads are ordinary tokens: different logits.
  const std::vector<float> bare = Feed(e.get(), padded, {}, padded.size());
  EXPECT_NE(0, std::memcmp(bare.data(), want.data(), want.size() * sizeof(float)));
}

TEST(MediaRows, PadsOutsideTheSpanKeepTheirEmbedding) {
  std::unique_ptr<Engine> e = Tiny();
  ASSERT_NE(e, nullptr);
  const auto pad = static_cast<int32_t>(e->config().media_placeholder_token_id);
  // A span over position 1 only: the pad at position 3 is the pad token's own row.
  const std::vector<float> want = Feed(e.get(), {3, 300, 9, pad}, {}, 4);
  const std::vector<float> got = Feed(e.get(), {3, pad, 9, pad}, {SpanOfTokens(e.get(), {300}, 1)}, 4);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
}

TEST(MediaRows, ResetDropsTheImagesAndSnapshotsKeepThem) {
  std::unique_ptr<Engine> e = Tiny();
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  ASSERT_TRUE(e->AttachMedia(seq.get(), {SpanOfTokens(e.get(), {300}, 0)}).ok());
  EXPECT_EQ(seq->media().size(), 1u);
  const SequenceSnapshot snap = e->Snapshot(*seq);
  EXPECT_EQ(snap.state.media.size(), 1u);
  seq->Reset();
  EXPECT_TRUE(seq->media().empty());
  ASSERT_TRUE(e->Restore(snap, seq.get()).ok());
  EXPECT_EQ(seq->media().size(), 1u);
}

TEST(MediaRows, SpansTheEngineCannotBindAreRefused) {
  std::unique_ptr<Engine> e = Tiny();
  ASSERT_NE(e, nullptr);
  std::unique_ptr<Sequence> seq = e->NewSequence();
  MediaSpan past = SpanOfTokens(e.get(), {300, 42}, 31);  // positions 31..32 of 32
  Status s = e->AttachMedia(seq.get(), {past});
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("positions 31..32"), std::string::npos) << s.ToString();
  MediaSpan wrong = SpanOfTokens(e.get(), {300, 42}, 0);
  wrong.rows = 3;  // more rows than the data holds
  s = e->AttachMedia(seq.get(), {wrong});
  EXPECT_NE(s.message().find("rows are not 3 x"), std::string::npos) << s.ToString();
  ASSERT_TRUE(e->AttachMedia(seq.get(), {SpanOfTokens(e.get(), {300, 42}, 0)}).ok());
  s = e->AttachMedia(seq.get(), {SpanOfTokens(e.get(), {5}, 1)});
  EXPECT_NE(s.message().find("overlaps an image"), std::string::npos) << s.ToString();
  // A sequence with images cannot be saved: the state file has no rows.
  s = e->SaveSequence(*seq, "/tmp/never-written.k3state");
  EXPECT_NE(s.message().find("holds images"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace k3::run
