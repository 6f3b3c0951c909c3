#include "k3verify/file_scan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "common/align.h"
#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "common/hex.h"
#include "common/parallel.h"

namespace k3::verify {
namespace {

constexpr uint64_t kWindow = 8u << 20;   // one read: large enough that the disk is the limit
constexpr uint64_t kSkipGap = 1u << 20;  // reading a gap this small beats a new request
constexpr uint64_t kReadAlign = 4096;

std::string Where(const ScanFile& f, const ScanItem& it) {
  return it.label + " (" + f.path + ", offset " + std::to_string(it.offset) + ", " +
         std::to_string(it.length) + " bytes)";
}

std::string ByteHex(uint8_t b) { return "0x" + HexUint(b, 2); }

// The per-file state of one scan: the item in progress, its hash streams, open source files.
class FileScanner {
 public:
  FileScanner(Env* env, ScanFile* file, Progress* progress)
      : env_(env), file_(file), progress_(progress) {}

  void Run(ScanStats* stats, std::vector<Status>* problems);

 private:
  void Begin(const ScanItem& it);
  // Bytes [rel, rel + n) of item `it`, at `data`.
  void Feed(const ScanItem& it, uint64_t rel, const uint8_t* data, uint64_t n);
  void Finish(const ScanItem& it, ScanStats* stats, std::vector<Status>* problems);
  Result<File*> Source(const std::string& path);

  Env* env_;
  ScanFile* file_;
  Progress* progress_;
  std::unique_ptr<Xxh3_128Stream> h128_;
  std::unique_ptr<Xxh3_64Stream> h64_;
  bool compare_failed_ = false;  // this item already has a reported difference or error
  std::vector<Status> item_problems_;
  std::map<std::string, std::unique_ptr<File>> sources_;
  std::vector<uint8_t> src_buf_;
};

Result<File*> FileScanner::Source(const std::string& path) {
  auto it = sources_.find(path);
  if (it != sources_.end()) return it->second.get();
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env_->Open(path, OpenMode::kRead));
  File* raw = f.get();
  sources_.emplace(path, std::move(f));
  return raw;
}

void FileScanner::Begin(const ScanItem& it) {
  h128_.reset();
  h64_.reset();
  if (it.hash == ScanHash::kXxh3_128) h128_ = std::make_unique<Xxh3_128Stream>();
  if (it.hash == ScanHash::kXxh3_64) h64_ = std::make_unique<Xxh3_64Stream>();
  compare_failed_ = false;
  item_problems_.clear();
}

void FileScanner::Feed(const ScanItem& it, uint64_t rel, const uint8_t* data, uint64_t n) {
  if (h128_) h128_->Update(data, static_cast<size_t>(n));
  if (h64_) h64_->Update(data, static_cast<size_t>(n));
  if (compare_failed_) return;
  for (const ScanSource& s : it.sources) {
    const uint64_t a = std::max(rel, s.item_offset);
    const uint64_t b = std::min(rel + n, s.item_offset + s.length);
    if (a >= b) continue;
    auto src = Source(s.path);
    Status st = src.ok() ? Status::Ok() : src.status();
    if (st.ok()) {
      src_buf_.resize(static_cast<size_t>(b - a));
      st = (*src)->ReadExact(s.offset + (a - s.item_offset), src_buf_.size(), src_buf_.data());
    }
    if (!st.ok()) {
      item_problems_.push_back(
          st.WithContext(Where(*file_, it) + ": reading its source " + s.label + " in " + s.path));
      compare_failed_ = true;
      return;
    }
    const uint8_t* packed = data + (a - rel);
    if (std::memcmp(packed, src_buf_.data(), src_buf_.size()) == 0) continue;
    uint64_t k = 0;
    while (packed[k] == src_buf_[k]) ++k;
    const uint64_t item_off = a + k;
    item_problems_.push_back(Status::Integrity(
        Where(*file_, it) + ": differs from its source " + s.label + " in " + s.path +
        ": first differing byte at offset " + std::to_string(item_off) + " of the region (" +
        file_->path + " offset " + std::to_string(it.offset + item_off) + " holds " +
        ByteHex(packed[k]) + ", source offset " +
        std::to_string(s.offset + (item_off - s.item_offset)) + " holds " +
        ByteHex(src_buf_[k]) +
        "); re-run k3prep pack, or check the source with k3verify shards"));
    compare_failed_ = true;
    return;
  }
}

void FileScanner::Finish(const ScanItem& it, ScanStats* stats, std::vector<Status>* problems) {
  if (h128_) {
    ++stats->items_hashed;
    const Hash128 got = h128_->Digest();
    if (got != it.want128) {
      problems->push_back(Status::Integrity(Where(*file_, it) + ": XXH3-128 is " + got.Hex() +
                                            ", " + it.want_from + " records " +
                                            it.want128.Hex() +
                                            " (the bytes changed after packing; re-run k3prep "
                                            "pack)"));
    }
  }
  if (h64_) {
    ++stats->items_hashed;
    const uint64_t got = h64_->Digest();
    if (got != it.want64) {
      problems->push_back(Status::Integrity(
          Where(*file_, it) + ": XXH3-64 is " + Hex64(got) + ", " + it.want_from + " records " +
          Hex64(it.want64) + " (the bytes changed after packing; re-run k3prep pack)"));
    }
  }
  if (!it.sources.empty()) ++stats->items_compared;
  for (Status& s : item_problems_) problems->push_back(std::move(s));
  item_problems_.clear();
  stats->bytes += it.length;
}

void FileScanner::Run(ScanStats* stats, std::vector<Status>* problems) {
  std::vector<ScanItem>& items = file_->items;
  std::sort(items.begin(), items.end(),
            [](const ScanItem& a, const ScanItem& b) { return a.offset < b.offset; });
  if (items.empty()) return;
  auto opened = env_->Open(file_->path, OpenMode::kReadDirect);
  if (!opened.ok()) {
    problems->push_back(opened.status().WithContext(
        file_->path + ": cannot be opened, so its " + std::to_string(items.size()) +
        " region(s) were not checked"));
    return;
  }
  std::unique_ptr<File> file = std::move(opened).value();
  auto size = file->Size();
  if (!size.ok()) {
    problems->push_back(size.status());
    return;
  }
  const uint32_t align = std::max<uint32_t>(1, env_->DirectAlignment(file_->path));
  auto buf = AlignedBuffer::Allocate(kWindow, kReadAlign);
  if (!buf.ok()) {
    problems->push_back(buf.status());
    return;
  }

  size_t i = 0;
  uint64_t done_in_item = 0;  // bytes of items[i] already fed
  uint64_t pos = 0;           // first byte not yet read
  bool begun = false;
  while (i < items.size()) {
    const ScanItem& cur = items[i];
    if (!begun) {
      Begin(cur);
      begun = true;
    }
    if (cur.length == 0) {
      Finish(cur, stats, problems);
      ++i;
      begun = false;
      continue;
    }
    const uint64_t need = cur.offset + done_in_item;
    const uint64_t start = (need >= pos && need - pos <= kSkipGap) ? pos : AlignDown(need, align);
    const uint64_t end = std::min(start + kWindow, *size);
    if (end <= need) {
      problems->push_back(Status::Invalid(
          file_->path + ": ends at " + std::to_string(*size) + " bytes, before " +
          Where(*file_, cur) + " and " + std::to_string(items.size() - i - 1) +
          " later region(s); re-run k3prep pack"));
      return;
    }
    Status st = DirectRead(file.get(), align, start, end - start, buf->data());
    if (!st.ok()) {
      problems->push_back(st.WithContext(
          Where(*file_, cur) + ": read failed, so it and " + std::to_string(items.size() - i - 1) +
          " later region(s) of " + file_->path + " were not checked"));
      return;
    }
    uint64_t fed = 0;
    const size_t first = i;  // the only item that may be partly fed already
    for (size_t j = first; j < items.size() && items[j].offset < end; ++j) {
      const ScanItem& it = items[j];
      if (j != first) Begin(it);
      const uint64_t a = std::max(start, it.offset + (j == first ? done_in_item : 0));
      const uint64_t b = std::min(end, it.offset + it.length);
      Feed(it, a - it.offset, buf->data() + (a - start), b - a);
      fed += b - a;
      if (b == it.offset + it.length) {
        Finish(it, stats, problems);
        i = j + 1;
        done_in_item = 0;
        begun = false;
      } else {
        i = j;
        done_in_item = b - it.offset;
        begun = true;
        break;
      }
    }
    progress_->Add(fed);
    pos = end;
  }
}

}  // namespace

ScanStats ScanFiles(Env* env, std::vector<ScanFile>& files, int jobs, Progress* progress,
                    std::vector<Status>* problems) {
  std::vector<ScanStats> stats(files.size());
  std::vector<std::vector<Status>> found(files.size());
  ParallelFor(files.size(), jobs, [&](size_t i, size_t) {
    FileScanner(env, &files[i], progress).Run(&stats[i], &found[i]);
  });
  ScanStats total;
  for (size_t i = 0; i < files.size(); ++i) {
    total.items_hashed += stats[i].items_hashed;
    total.items_compared += stats[i].items_compared;
    total.bytes += stats[i].bytes;
    for (Status& s : found[i]) problems->push_back(std::move(s));
  }
  return total;
}

}  // namespace k3::verify
