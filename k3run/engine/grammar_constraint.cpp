#include "k3run/engine/grammar_constraint.h"

#include <chrono>

namespace k3::run {

GrammarVocabulary MakeGrammarVocabulary(const tok::Tokenizer& tok,
                                        const std::vector<int64_t>& end_ids) {
  GrammarVocabulary out;
  auto v = std::make_shared<grammar::Vocabulary>();
  const int64_t n = tok.vocab_size();
  v->bytes.resize(static_cast<size_t>(n));
  v->special_symbol.assign(static_cast<size_t>(n), grammar::kOrdinaryToken);
  for (int64_t id = 0; id < n; ++id) {
    const auto i = static_cast<int32_t>(id);
    const std::string_view bytes = tok.TokenBytes(i);
    if (!tok::IsAddedToken(tok, i)) {
      v->bytes[static_cast<size_t>(id)] = std::string(bytes);
      continue;
    }
    bool is_end = false;
    for (int64_t e : end_ids) is_end = is_end || e == id;
    if (is_end) {
      v->special_symbol[static_cast<size_t>(id)] = grammar::kEndToken;
    } else {
      v->special_symbol[static_cast<size_t>(id)] = static_cast<int32_t>(out.special_names.size());
      out.special_names.emplace_back(bytes);
    }
  }
  // The trie costs ~0.1 s at the released vocabulary: once per vocabulary, not per grammar.
  out.trie = grammar::TokenTrie::ForVocabulary(*v);
  out.vocab = std::move(v);
  return out;
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarLibrary::Compile(
    const std::string& gbnf, const std::string& source) {
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first == gbnf) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front().second;
      }
    }
  }
  K3_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Grammar> g,
                      grammar::Grammar::Parse(gbnf, vocab_.special_names, source));
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g;
  compiled->vocab = vocab_.vocab;
  compiled->masker =
      std::make_shared<const grammar::TokenMasker>(std::move(g), vocab_.vocab, vocab_.trie);
  std::lock_guard<std::mutex> l(mu_);
  lru_.emplace_front(gbnf, compiled);
  while (lru_.size() > max_) lru_.pop_back();
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> compiled)
    : compiled_(std::move(compiled)), matcher_(compiled_->grammar) {
  StartNextMask();
}

GrammarConstraint::~GrammarConstraint() {
  if (next_.valid()) next_.wait();
}

void GrammarConstraint::StartNextMask() {
  // The masker and a copy of the state travel with the task: it never touches *this.
  next_ = std::async(std::launch::async, [compiled = compiled_, state = matcher_]() {
    const auto t0 = std::chrono::steady_clock::now();
    Computed c;
    compiled->masker->Allowed(state, &c.bits);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return c;
  });
}

Result<const float*> GrammarConstraint::Mask(const float* logits, int64_t vocab) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!next_.valid()) StartNextMask();
  const Computed computed = next_.get();
  masked_.assign(logits, logits + vocab);
  const int64_t allowed = grammar::ApplyAllowed(computed.bits, masked_.data(), vocab);
  timing_.compute_seconds.push_back(computed.seconds);
  timing_.wait_seconds.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (allowed == 0) {
    return Status::Invalid("the grammar allows no token here (it is complete and the "
                           "vocabulary has no end token it may end with)");
  }
  return masked_.data();
}

Status GrammarConstraint::Accept(int32_t id) {
  if (next_.valid()) next_.wait();
  if (!matcher_.AcceptToken(*compiled_->vocab, id)) {
    return Status::Invalid("token " + std::to_string(id) + " is not allowed by the grammar");
  }
  StartNextMask();
  return Status::Ok();
}

Result<std::shared_ptr<TokenConstraint>> MakeGrammarConstraint(GrammarLibrary* library,
                                                               const std::string& gbnf,
                                                               const std::string& source) {
  K3_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled,
                      library->Compile(gbnf, source));
  return std::shared_ptr<TokenConstraint>(
      std::make_shared<GrammarConstraint>(std::move(compiled)));
}

}  // namespace k3::run
