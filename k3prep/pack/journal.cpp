// The --resume journal: identity, lines, parsing and re-verification (see k3prep/pack/journal.h).
#include "k3prep/pack/journal.h"

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <vector>

#include "common/hex.h"
#include "common/log.h"
#include "formats/config.h"

namespace k3::prep::pack_internal {

Hash128 PlanIdentity(const Plan& plan, prepared::ExpertsMode mode) {
  std::string id = "k3pack-journal-v1\n" + CanonicalConfigJson(plan.config) + "\nmode " +
                   prepared::ExpertsModeName(mode) + "\n";
  for (const Stream& s : plan.streams) {
    id += "stream " + s.final_path + " " + std::to_string(s.size) + " " +
          std::to_string(s.units.size()) + "\n";
  }
  for (const prepared::SourceShard& s : plan.source.shards) {
    id += "shard " + s.name + " " + std::to_string(s.size) + "\n";
  }
  return Xxh3_128(id.data(), id.size());
}

std::string JournalHeader(const Hash128& identity) {
  return "k3pack-journal 1 " + identity.Hex() + "\n";
}

std::string JournalLine(const Plan& plan, size_t unit_index) {
  const Unit& u = plan.units[unit_index];
  std::string body = "u " + std::to_string(unit_index) + " " + u.span.Hex() + " " +
                     std::to_string(u.regions.size() + u.experts.size());
  for (int32_t r : u.regions) body += " " + plan.regions[static_cast<size_t>(r)].xxh3_128.Hex();
  for (int32_t e : u.experts) body += " " + Hex64(plan.records[static_cast<size_t>(e)].xxh3_64);
  return body + " " + Hex64(Xxh3_64(body.data(), body.size())) + "\n";
}

namespace {

struct JournalEntry {
  Hash128 span;
  std::vector<std::string> hashes;
};

std::vector<std::string> SplitSpaces(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < line.size()) {
    size_t end = line.find(' ', start);
    if (end == std::string::npos) end = line.size();
    out.push_back(line.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Entries of a journal whose identity matches; malformed or torn lines are skipped.
std::map<size_t, JournalEntry> ParseJournal(const std::string& text, const Hash128& identity,
                                            size_t n_units, bool* identity_ok) {
  std::map<size_t, JournalEntry> out;
  const std::string header = JournalHeader(identity);
  *identity_ok = text.compare(0, header.size(), header) == 0;
  if (!*identity_ok) return out;
  size_t pos = header.size();
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // torn last line
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t last = line.find_last_of(' ');
    if (last == std::string::npos) continue;
    const std::string body = line.substr(0, last);
    if (Hex64(Xxh3_64(body.data(), body.size())) != line.substr(last + 1)) continue;
    const std::vector<std::string> f = SplitSpaces(body);
    if (f.size() < 4 || f[0] != "u") continue;
    JournalEntry e;
    size_t index = 0, count = 0;
    try {
      index = std::stoull(f[1]);
      count = std::stoull(f[3]);
    } catch (const std::exception&) {
      continue;
    }
    if (index >= n_units || f.size() != 4 + count || !Hash128::FromHex(f[2], &e.span)) continue;
    e.hashes.assign(f.begin() + 4, f.end());
    out[index] = std::move(e);
  }
  return out;
}

Result<Hash128> HashSpan(Env* env, const std::string& path, uint64_t begin, uint64_t end,
                         std::vector<uint8_t>* buf) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(path, OpenMode::kRead));
  Xxh3_128Stream h;
  for (uint64_t pos = begin; pos < end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(end - pos, buf->size()));
    K3_RETURN_IF_ERROR(f->ReadExact(pos, n, buf->data()));
    h.Update(buf->data(), n);
    pos += n;
  }
  return h.Digest();
}

}  // namespace

std::string ReverifyJournal(Env* env, const std::string& journal_path, const Hash128& identity,
                            Plan* plan, PackStats* stats, uint64_t window_bytes) {
  const std::string header = JournalHeader(identity);
  if (!env->Exists(journal_path)) return header;
  Result<std::string> text = ReadFileToString(env, journal_path);
  if (!text.ok()) {
    LogWarn("resume: cannot read " + journal_path + " (" + text.status().message() +
            "); redoing everything");
    return header;
  }
  bool identity_ok = false;
  std::map<size_t, JournalEntry> entries =
      ParseJournal(*text, identity, plan->units.size(), &identity_ok);
  if (!identity_ok) {
    LogWarn("resume: " + journal_path +
            " belongs to a different checkpoint, mode or output plan; redoing everything");
    return header;
  }
  std::string out = header;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(window_bytes, 8 << 20)));
  for (auto& [index, e] : entries) {
    Unit& u = plan->units[index];
    const Stream& s = plan->streams[u.stream];
    if (s.final_path.empty() || e.hashes.size() != u.regions.size() + u.experts.size()) continue;
    std::vector<Hash128> rh(u.regions.size());
    std::vector<uint64_t> eh(u.experts.size());
    bool parsed = true;
    for (size_t i = 0; i < rh.size(); ++i) parsed = parsed && Hash128::FromHex(e.hashes[i], &rh[i]);
    for (size_t i = 0; i < eh.size(); ++i) {
      parsed = parsed && ParseHexUint(e.hashes[rh.size() + i], 16, &eh[i]);
    }
    if (!parsed) continue;
    const std::string tmp = TempPathFor(s.final_path);
    if (!env->Exists(tmp)) continue;
    Result<Hash128> got = HashSpan(env, tmp, u.begin, u.end, &buf);
    stats->bytes_reverified += u.end - u.begin;
    if (!got.ok() || *got != e.span) continue;  // short, unreadable or changed: redo it
    u.reused = true;
    u.span = e.span;
    for (size_t i = 0; i < rh.size(); ++i) {
      plan->regions[static_cast<size_t>(u.regions[i])].xxh3_128 = rh[i];
    }
    for (size_t i = 0; i < eh.size(); ++i) {
      const size_t rec = static_cast<size_t>(u.experts[i]);
      plan->records[rec].xxh3_64 = eh[i];
      plan->expert_hashed[rec] = true;
    }
    ++stats->units_reused;
    stats->regions_reused += u.regions.size();
    stats->experts_reused += u.experts.size();
    out += JournalLine(*plan, index);
  }
  return out;
}

}  // namespace k3::prep::pack_internal
