#include "k3run/grammar/token_trie.h"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "k3run/grammar/token_masker.h"

namespace k3::run::grammar {

TokenTrie TokenTrie::Build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids) {
  TokenTrie t;
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Byte-wise order (std::string compares char, which may be signed): preorder of the trie.
  auto as_bytes = [&](size_t k) {
    return std::basic_string_view<unsigned char>(
        reinterpret_cast<const unsigned char*>(bytes[k].data()), bytes[k].size());
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return as_bytes(a) < as_bytes(b); });
  std::vector<int32_t> path;  // path[d-1]: node at depth d on the current path
  std::vector<int32_t> node_of_token;
  std::vector<int32_t> token_of;
  std::string_view prev;
  for (const size_t k : order) {
    const std::string_view s = bytes[k];
    if (s.empty() || s.size() > kMaxTokenBytes) continue;
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    path.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(t.nodes.size()));
      t.nodes.push_back({static_cast<uint8_t>(s[d]), 0, static_cast<uint16_t>(d + 1), 0});
    }
    node_of_token.push_back(path.back());
    t.nodes[static_cast<size_t>(path.back())].has_tokens = 1;
    token_of.push_back(ids[k]);
    t.max_depth = std::max(t.max_depth, static_cast<int32_t>(s.size()));
    prev = s;
  }
  const auto n = static_cast<int32_t>(t.nodes.size());
  // skip: the first later node no deeper than this one (its subtree has ended).
  std::vector<int32_t> open;
  for (int32_t i = 0; i < n; ++i) {
    TrieNode& node = t.nodes[static_cast<size_t>(i)];
    node.skip = n;
    while (!open.empty() && t.nodes[static_cast<size_t>(open.back())].depth >= node.depth) {
      t.nodes[static_cast<size_t>(open.back())].skip = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  // Tokens were visited in preorder of their end nodes, so node_of_token is nondecreasing.
  t.token_begin.assign(static_cast<size_t>(n) + 1, 0);
  for (const int32_t node : node_of_token) ++t.token_begin[static_cast<size_t>(node) + 1];
  std::partial_sum(t.token_begin.begin(), t.token_begin.end(), t.token_begin.begin());
  t.token_ids = std::move(token_of);
  return t;
}

std::shared_ptr<const TokenTrie> TokenTrie::ForVocabulary(const Vocabulary& v) {
  std::vector<std::string> ordinary;
  std::vector<int32_t> ids;
  for (size_t id = 0; id < v.bytes.size(); ++id) {
    const int32_t s = id < v.special_symbol.size() ? v.special_symbol[id] : kOrdinaryToken;
    if (s != kOrdinaryToken || v.bytes[id].empty()) continue;
    ordinary.push_back(v.bytes[id]);
    ids.push_back(static_cast<int32_t>(id));
  }
  return std::make_shared<const TokenTrie>(Build(ordinary, ids));
}

}  // namespace k3::run::grammar
