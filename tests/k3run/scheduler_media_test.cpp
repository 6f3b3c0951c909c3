// engine/scheduler.h with images (Request::media): a request's spans give the logits of feeding
// the rows they hold (the rows here are embedding rows of tokens, so the expectation is the
// plain prompt of those tokens run alone), and the prompt cache never restores a prefix whose
// images differ: two requests with the same ids and same-size images but other rows do not
// share a snapshot past the first pad, while the same image re-sent does, with the bits of a
// cold run.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine_fixture.h"
#include "k3run/engine/media.h"
#include "k3run/engine/scheduler.h"
#include "k3run/engine/session.h"

namespace k3::run {
namespace {

using testing::SpanOfTokens;
using testing::TinyPreparedDir;

struct Got {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  RequestResult result;
};

Request Make(const std::vector<int32_t>& prompt, std::vector<MediaSpan> media, int64_t gen,
             Got* out, int64_t vocab) {
  Request r;
  r.prompt = prompt;
  r.media = std::move(media);
  r.max_tokens = gen;
  r.on_token = [out, vocab](int32_t, const float* l) {
    out->logits.insert(out->logits.end(), l, l + vocab);
    return true;
  };
  r.on_done = [out](const RequestResult& rr) {
    out->result = rr;
    out->ids = rr.generated;
  };
  return r;
}

// One request through its own scheduler, no cache: "its run alone".
Got Alone(Engine* e, const std::vector<int32_t>& prompt, std::vector<MediaSpan> media,
          int64_t gen) {
  Got g;
  Scheduler sched(e, SchedulerOptions{});
  EXPECT_TRUE(sched.Submit(Make(prompt, std::move(media), gen, &g, e->config().vocab)).ok());
  EXPECT_TRUE(sched.RunUntilIdle().ok());
  return g;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class SchedulerMedia : public ::testing::Test {
 protected:
  void SetUp() override {
    e_ = testing::OpenPlanned(TinyPreparedDir(), testing::ContextPlan(48));
    ASSERT_NE(e_, nullptr);
    pad_ = static_cast<int32_t>(e_->config().media_placeholder_token_id);
    ASSERT_GT(pad_, 0);
    V_ = e_->config().vocab;
  }
  std::unique_ptr<Engine> e_;
  int32_t pad_ = -1;
  int64_t V_ = 0;
};

TEST_F(SchedulerMedia, SpansGiveTheLogitsOfTheirRows) {
  const std::vector<int32_t> plain = {3, 7, 300, 42, 11, 5};
  const std::vector<int32_t> padded = {3, 7, pad_, pad_, 11, 5};
  const Got want = Alone(e_.get(), plain, {}, 4);
  const Got got = Alone(e_.get(), padded, {SpanOfTokens(e_.get(), {300, 42}, 2)}, 4);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_TRUE(SameBits(got.logits, want.logits));
  // The pads themselves, without the span: another input.
  EXPECT_FALSE(SameBits(Alone(e_.get(), padded, {}, 4).logits, want.logits));
}

TEST_F(SchedulerMedia, PromptCacheNeverRestoresAnotherImage) {
  // A: text, a 2-row image X, text. B and C extend A's prompt (a chat's next turn): B with an
  // image Y of the same size at the same place (other rows), C with X again.
  const std::vector<int32_t> a = {3, 7, pad_, pad_, 11, 5};
  std::vector<int32_t> next = a;
  next.insert(next.end(), {9, 8, 21});
  const MediaSpan x = SpanOfTokens(e_.get(), {300, 42}, 2);
  const MediaSpan y = SpanOfTokens(e_.get(), {301, 43}, 2);
  ASSERT_FALSE(x.id == y.id);

  SchedulerOptions o;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e_.get(), o);
  Got ga, gb, gc;
  ASSERT_TRUE(sched.Submit(Make(a, {x}, 2, &ga, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  ASSERT_TRUE(sched.Submit(Make(next, {y}, 3, &gb, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  // B's ids equal A's snapshot up to the end of A's prompt, but its image differs: fed cold.
  EXPECT_EQ(gb.result.prompt_fed, static_cast<int64_t>(next.size()));
  EXPECT_EQ(sched.Stats().prompt_cache_hits, 0);
  const Got b_alone = Alone(e_.get(), next, {y}, 3);
  EXPECT_EQ(gb.ids, b_alone.ids);
  EXPECT_TRUE(SameBits(gb.logits, b_alone.logits));
  // And that is the input with Y's rows, not X's.
  std::vector<int32_t> with_y = next;
  with_y[2] = 301;
  with_y[3] = 43;
  EXPECT_TRUE(SameBits(gb.logits, Alone(e_.get(), with_y, {}, 3).logits));
  EXPECT_FALSE(SameBits(gb.logits, Alone(e_.get(), next, {x}, 3).logits));

  // C: the same image re-sent: A's end-of-prompt snapshot serves its 6 ids, same bits.
  ASSERT_TRUE(sched.Submit(Make(next, {SpanOfTokens(e_.get(), {300, 42}, 2)}, 3, &gc, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(sched.Stats().prompt_cache_hits, 1);
  EXPECT_EQ(gc.result.prompt_fed, static_cast<int64_t>(next.size() - a.size()));
  const Got c_alone = Alone(e_.get(), next, {x}, 3);
  EXPECT_EQ(gc.ids, c_alone.ids);
  EXPECT_TRUE(SameBits(gc.logits, c_alone.logits));
}

TEST_F(SchedulerMedia, ASnapshotWithoutTheImageIsNotRestoredForOneWithIt) {
  // The same ids fed as plain pads (no span) must not serve a request whose pads hold rows.
  const std::vector<int32_t> a = {3, 7, pad_, pad_, 11, 5};
  std::vector<int32_t> next = a;
  next.push_back(9);
  SchedulerOptions o;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e_.get(), o);
  Got ga, gb;
  ASSERT_TRUE(sched.Submit(Make(a, {}, 1, &ga, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  const MediaSpan x = SpanOfTokens(e_.get(), {300, 42}, 2);
  ASSERT_TRUE(sched.Submit(Make(next, {x}, 2, &gb, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  EXPECT_EQ(sched.Stats().prompt_cache_hits, 0);
  EXPECT_TRUE(SameBits(gb.logits, Alone(e_.get(), next, {x}, 2).logits));
}

// A request's encode_media gets a lookup of the rows the prompt cache's snapshots hold, by tower
// input (MediaSpan::input): what lets a re-sent image skip the tower. It finds the span A left
// (the same rows, not a copy), nothing for another input or the zero input, and the rows it
// finds give the bits of the image sent cold.
TEST_F(SchedulerMedia, EncodeMediaFindsTheRowsTheCacheHoldsByTowerInput) {
  const std::vector<int32_t> a = {3, 7, pad_, pad_, 11, 5};
  std::vector<int32_t> next = a;
  next.insert(next.end(), {9, pad_, pad_, 4});
  MediaSpan x = SpanOfTokens(e_.get(), {300, 42}, 2);
  x.input = Hash128{1, 2};
  SchedulerOptions o;
  o.prompt_cache_bytes = uint64_t{1} << 30;
  Scheduler sched(e_.get(), o);
  Got ga, gb;
  ASSERT_TRUE(sched.Submit(Make(a, {x}, 2, &ga, V_)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  // B re-sends X at 2 and X again at 7 (a second copy of the same image later in the chat).
  const MediaSpan* found = nullptr;
  bool other = true, zero = true;
  Request b = Make(next, {}, 2, &gb, V_);
  b.encode_media = [&](const MediaLookup& held) -> Result<std::vector<MediaSpan>> {
    found = held(Hash128{1, 2});
    other = held(Hash128{3, 4}) != nullptr;
    zero = held(Hash128{}) != nullptr;
    if (found == nullptr) return Status::Invalid("X's rows are not held");
    MediaSpan first = *found, second = *found;
    first.first = 2;
    second.first = 7;
    return std::vector<MediaSpan>{first, second};
  };
  ASSERT_TRUE(sched.Submit(std::move(b)).ok());
  ASSERT_TRUE(sched.RunUntilIdle().ok());
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->data, x.data);  // the snapshot's rows themselves
  EXPECT_FALSE(other);
  EXPECT_FALSE(zero);
  MediaSpan x7 = SpanOfTokens(e_.get(), {300, 42}, 7);
  const Got cold = Alone(e_.get(), next, {x, x7}, 2);
  EXPECT_EQ(gb.ids, cold.ids);
  EXPECT_TRUE(SameBits(gb.logits, cold.logits));
}

TEST_F(SchedulerMedia, SpansOutsideThePromptAreRefused) {
  Scheduler sched(e_.get(), SchedulerOptions{});
  Got g;
  const std::vector<int32_t> p = {3, pad_, pad_};
  Result<int64_t> r = sched.Submit(Make(p, {SpanOfTokens(e_.get(), {300, 42}, 2)}, 1, &g, V_));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("positions 2..3: not inside the prompt of 3 ids"),
            std::string::npos)
      << r.status().ToString();
  MediaSpan short_rows = SpanOfTokens(e_.get(), {300, 42}, 1);
  short_rows.rows = 1;
  r = sched.Submit(Make(p, {short_rows}, 1, &g, V_));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rows are not 1 x"), std::string::npos);
  r = sched.Submit(Make(p, {SpanOfTokens(e_.get(), {300}, 2), SpanOfTokens(e_.get(), {42}, 1)}, 1, &g, V_));
  ASSERT_FALSE(r.ok());  // out of order
}

}  // namespace
}  // namespace k3::run
