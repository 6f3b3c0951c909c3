// The pack pipeline: batched reads, hashing in destination order, writes, fsyncs and the
// journal's appends (see k3prep/pack/pipeline.h).
#include "k3prep/pack/pipeline.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/align.h"
#include "k3prep/pack/journal.h"

namespace k3::prep::pack_internal {

Status Packer::OpenSources() {
  for (const std::string& path : plan_->sources) {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env_->Open(path, OpenMode::kReadDirect));
    sources_.push_back(std::move(f));
  }
  return Status::Ok();
}

Status Packer::OpenOutputs() {
  outputs_.resize(plan_->streams.size());
  out_align_.assign(plan_->streams.size(), 0);
  out_direct_.assign(plan_->streams.size(), false);
  std::vector<bool> keep(plan_->streams.size(), false);
  for (const Unit& u : plan_->units) keep[u.stream] = keep[u.stream] || u.reused;
  for (size_t i = 0; i < plan_->streams.size(); ++i) {
    const Stream& s = plan_->streams[i];
    if (s.final_path.empty()) continue;
    const std::string tmp = TempPathFor(s.final_path);
    K3_ASSIGN_OR_RETURN(outputs_[i],
                        env_->Open(tmp, keep[i] ? OpenMode::kReadWrite : OpenMode::kCreate));
    if (outputs_[i]->fd() >= 0) out_align_[i] = env_->DirectAlignment(tmp);
  }
  return Status::Ok();
}

// Why O_DIRECT: buffered writes cost a kernel copy of every output byte into fresh page-cache
// pages plus the writeback work, on the consumer thread that also hashes; measured on the
// bench preset that copy was most of the consumer's time and held pack(copy) at half of cp.
// Direct writes go from the window buffer (already aligned) straight to the device and
// overlap with the reader's direct reads. The bytes written are the same either way; the file
// is switched with File::SetDirect (real files only; fault-injecting ones stay buffered).
// A write that is not aligned (offset, length or memory) goes through the page cache; a
// direct write that fails is redone buffered, so errors read exactly as before.
Status Packer::WriteOut(size_t stream, uint64_t offset, const uint8_t* data, uint64_t len) {
  File* out = outputs_[stream].get();
  const uint32_t a = out_align_[stream];
  const bool aligned = a > 0 && offset % a == 0 && len % a == 0 &&
                       reinterpret_cast<uintptr_t>(data) % a == 0;
  if (aligned != out_direct_[stream]) {
    if (out->SetDirect(aligned).ok()) {
      out_direct_[stream] = aligned;
    } else if (aligned) {
      out_align_[stream] = 0;  // this descriptor cannot go direct: stay buffered
    }
  }
  if (out_direct_[stream]) {
    if (out->WriteExact(offset, data, len).ok()) return Status::Ok();
    out_align_[stream] = 0;
    if (out->SetDirect(false).ok()) out_direct_[stream] = false;
  }
  return out->WriteExact(offset, data, len);
}

Status Packer::StartJournal(const std::string& path, const std::string& initial) {
  K3_RETURN_IF_ERROR(WriteFileAtomic(env_, path, initial));
  K3_ASSIGN_OR_RETURN(journal_, env_->Open(path, OpenMode::kReadWrite));
  journal_size_ = initial.size();
  return Status::Ok();
}

Status Packer::Run(const std::vector<Window>& windows, Progress* progress) {
  progress_ = progress;
  windows_ = &windows;
  StartSyncer();
  Status s = o_.jobs <= 1 ? RunSerial() : RunOverlapped();
  StopSyncer();
  if (!s.ok()) {
    // Keep what is finished for --resume; the original error is what the user needs.
    (void)FlushJournal(/*best_effort=*/true);
    return s;
  }
  return FlushJournal();
}

Status Packer::FinishOutputs() {
  if (!early_sync_status_.ok()) return early_sync_status_;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (!outputs_[i]) continue;
    K3_RETURN_IF_ERROR(outputs_[i]->Truncate(plan_->streams[i].size));
    K3_RETURN_IF_ERROR(outputs_[i]->Sync());
    K3_RETURN_IF_ERROR(outputs_[i]->Close());
    outputs_[i].reset();
  }
  if (journal_) {
    Status s = journal_->Close();
    journal_.reset();
    return s;
  }
  return Status::Ok();
}

// Reads a window's source bytes. Pieces are small (a 26 KB expert, a norm vector) and sit
// at arbitrary offsets, so reading each one with O_DIRECT would mean many small bounced
// reads. Instead the source ranges are coalesced per shard (bridging gaps up to kBridgeBytes),
// widened to whole 4 KiB blocks, read in one batch into a staging buffer (large aligned
// reads, straight into memory) and copied into place.
// A batch is consecutive windows (of one or several streams) laid out back to back in one
// buffer: small expert files (one per layer) would otherwise each cost a read round trip.
Status Packer::Fill(const Batch& batch, uint8_t* buf, BatchReader* reader) {
  struct Want {
    uint32_t src;
    uint64_t off, len;
    uint8_t* dst;
  };
  std::vector<Want> wants;
  uint8_t* base = buf;
  for (size_t k = batch.first; k < batch.first + batch.count; ++k) {
    const Window& w = (*windows_)[k];
    const Stream& s = plan_->streams[w.stream];
    for (const Seg& seg : w.segs) {
      uint8_t* dst = base + (seg.dst - w.begin);
      if (seg.piece < 0) {
        std::memset(dst, 0, seg.len);
        continue;
      }
      const Piece& p = s.pieces[static_cast<size_t>(seg.piece)];
      wants.push_back(Want{p.src, p.src_off + (seg.dst - p.dst), seg.len, dst});
    }
    base += w.end - w.begin;
  }
  std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) {
    return a.src != b.src ? a.src < b.src : a.off < b.off;
  });
  struct Range {
    uint32_t src;
    uint64_t begin, end;  // block-aligned (end capped at the file size)
    uint64_t staged = 0;  // offset in staging_
  };
  std::vector<Range> ranges;
  std::vector<size_t> range_of(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    const Want& x = wants[i];
    const uint64_t b = x.off / kBlock * kBlock;
    const uint64_t e = std::min(AlignUp(x.off + x.len, kBlock), plan_->source_sizes[x.src]);
    if (!ranges.empty() && ranges.back().src == x.src && b <= ranges.back().end + kBridgeBytes) {
      ranges.back().end = std::max(ranges.back().end, e);
    } else {
      ranges.push_back(Range{x.src, b, e});
    }
    range_of[i] = ranges.size() - 1;
  }
  uint64_t total = 0;
  for (Range& r : ranges) {
    r.staged = total;
    total += AlignUp(r.end - r.begin, kBlock);
  }
  if (staging_.size() < total) {
    K3_ASSIGN_OR_RETURN(staging_, AlignedBuffer::AllocateHuge(total + (1 << 20)));
  }
  std::vector<ReadRequest> reqs(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    reqs[i].file = sources_[ranges[i].src].get();
    reqs[i].offset = ranges[i].begin;
    reqs[i].length = ranges[i].end - ranges[i].begin;
    reqs[i].dst = staging_.data() + ranges[i].staged;
  }
  K3_RETURN_IF_ERROR(reader->ReadAll(reqs));
  for (size_t i = 0; i < wants.size(); ++i) {
    const Range& r = ranges[range_of[i]];
    std::memcpy(wants[i].dst, staging_.data() + r.staged + (wants[i].off - r.begin),
                wants[i].len);
  }
  return Status::Ok();
}

Status Packer::Consume(const Window& w, const uint8_t* buf) {
  Stream& s = plan_->streams[w.stream];
  std::vector<size_t> finished;  // units that end in this window: journaled once written
  for (const Seg& seg : w.segs) {
    const uint8_t* data = buf + (seg.dst - w.begin);
    // The unit this segment belongs to (segments never cross unit ends).
    while (plan_->units[s.units[unit_cursor_[w.stream]]].end <= seg.dst) ++unit_cursor_[w.stream];
    const size_t unit_id = s.units[unit_cursor_[w.stream]];
    Unit& unit = plan_->units[unit_id];
    if (unit_id != cur_unit_) {
      cur_unit_ = unit_id;
      unit_hash_ = std::make_unique<Xxh3_128Stream>();
      if (unit.layer >= 0) {
        progress_->SetStatus(s.label + " layer " + std::to_string(unit.layer) + "/" +
                             std::to_string(plan_->config.n_layers - 1));
      } else {
        progress_->SetStatus(s.label);
      }
    }
    unit_hash_->Update(data, seg.len);
    if (seg.piece >= 0) {
      const Piece& p = s.pieces[static_cast<size_t>(seg.piece)];
      stats_->bytes_read += seg.len;
      if (p.region >= 0) {
        prepared::Region& r = plan_->regions[static_cast<size_t>(p.region)];
        if (p.region != cur_region_) {
          cur_region_ = p.region;
          region_hash_ = std::make_unique<Xxh3_128Stream>();
          region_left_ = r.length;
        }
        region_hash_->Update(data, seg.len);
        region_left_ -= seg.len;
        if (region_left_ == 0) r.xxh3_128 = region_hash_->Digest();
      }
      if (p.expert >= 0) {
        const size_t e = static_cast<size_t>(p.expert);
        if (p.expert != cur_expert_) {
          cur_expert_ = p.expert;
          expert_hash_ = std::make_unique<Xxh3_64Stream>();
          expert_left_ = plan_->expert_bytes;
        }
        expert_hash_->Update(data, seg.len);
        expert_left_ -= seg.len;
        if (expert_left_ == 0) {
          plan_->records[e].xxh3_64 = expert_hash_->Digest();
          plan_->expert_hashed[e] = true;
        }
      }
    }
    if (seg.dst + seg.len == unit.end) {
      unit.span = unit_hash_->Digest();
      if (!s.final_path.empty()) finished.push_back(unit_id);
    }
  }
  if (outputs_[w.stream]) {
    K3_RETURN_IF_ERROR(WriteOut(w.stream, w.begin, buf, w.end - w.begin));
    stats_->bytes_written += w.end - w.begin;
    unflushed_ += w.end - w.begin;
    dirty_[w.stream] = true;
    pending_.insert(pending_.end(), finished.begin(), finished.end());
    if (w.end == s.size) QueueSync(w.stream);
  }
  progress_->Add(w.end - w.begin);
  if (unflushed_ >= o_.journal_flush_bytes) {
    K3_RETURN_IF_ERROR(FlushJournal());
  }
  return Status::Ok();
}

// Makes finished units durable: fsync the outputs they live in, then append their lines.
// best_effort (after a failure): an output whose fsync fails loses its pending lines (those
// units are redone by --resume) instead of failing the flush.
Status Packer::FlushJournal(bool best_effort) {
  unflushed_ = 0;
  if (pending_.empty() || !journal_) return Status::Ok();
  std::map<size_t, bool> synced;
  for (auto& [stream, dirty] : dirty_) {
    if (dirty) {
      Status s;
      {
        std::lock_guard<std::mutex> lock(sync_mu_);
        s = outputs_[stream]->Sync();
      }
      {
        // A failed early fsync is reported once; a later fsync may then "succeed".
        std::lock_guard<std::mutex> lock(queue_mu_);
        if (s.ok() && early_sync_failed_.count(stream)) s = early_sync_status_;
      }
      if (!s.ok() && !best_effort) return s;
      synced[stream] = s.ok();
    }
    dirty = false;
  }
  std::string text;
  for (size_t u : pending_) {
    // Every pending unit's stream is dirty (written since the last flush), so it is in
    // `synced`; only units whose bytes reached the disk get a line.
    auto it = synced.find(plan_->units[u].stream);
    if (it != synced.end() && it->second) text += JournalLine(*plan_, u);
  }
  pending_.clear();
  K3_RETURN_IF_ERROR(journal_->WriteExact(journal_size_, text.data(), text.size()));
  journal_size_ += text.size();
  return journal_->Sync();
}

// Consumes every window of a filled batch, in order.
Status Packer::ConsumeBatch(const Batch& batch, const uint8_t* buf) {
  for (size_t k = batch.first; k < batch.first + batch.count; ++k) {
    const Window& w = (*windows_)[k];
    K3_RETURN_IF_ERROR(Consume(w, buf));
    buf += w.end - w.begin;
  }
  return Status::Ok();
}

// Consecutive windows grouped up to window_bytes per buffer.
std::vector<Batch> Packer::MakeBatches() const {
  std::vector<Batch> out;
  uint64_t bytes = 0;
  for (size_t k = 0; k < windows_->size(); ++k) {
    const uint64_t n = (*windows_)[k].end - (*windows_)[k].begin;
    if (out.empty() || bytes + n > o_.window_bytes) {
      out.push_back(Batch{k, 0});
      bytes = 0;
    }
    ++out.back().count;
    bytes += n;
  }
  return out;
}

std::unique_ptr<BatchReader> Packer::CreateReader() {
  std::unique_ptr<BatchReader> reader =
      BatchReader::Create(BatchReader::kDefaultQueueDepth, o_.force_pread);
  backend_ = std::string(reader->backend());
  return reader;
}

Status Packer::RunSerial() {
  std::unique_ptr<BatchReader> reader = CreateReader();
  K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::AllocateHuge(o_.window_bytes));
  InitCursors();
  for (const Batch& b : MakeBatches()) {
    K3_RETURN_IF_ERROR(Fill(b, buf.data(), reader.get()));
    K3_RETURN_IF_ERROR(ConsumeBatch(b, buf.data()));
  }
  return Status::Ok();
}

// The reader thread runs up to kBuffers batches ahead of the consumer (this thread).
Status Packer::RunOverlapped() {
  std::unique_ptr<BatchReader> reader = CreateReader();
  std::vector<AlignedBuffer> bufs;
  for (size_t i = 0; i < kBuffers; ++i) {
    K3_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::AllocateHuge(o_.window_bytes));
    bufs.push_back(std::move(b));
  }
  InitCursors();
  const std::vector<Batch> batches = MakeBatches();
  std::mutex mu;
  std::condition_variable cv;
  size_t filled = 0, consumed = 0;
  bool stop = false;
  std::vector<Status> fill_status(kBuffers);
  std::thread thread([&] {
    for (size_t i = 0; i < batches.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || filled - consumed < kBuffers; });
        if (stop) return;
      }
      Status s = Fill(batches[i], bufs[i % kBuffers].data(), reader.get());
      const bool failed = !s.ok();
      {
        std::lock_guard<std::mutex> lock(mu);
        fill_status[i % kBuffers] = std::move(s);
        ++filled;
      }
      cv.notify_all();
      if (failed) return;
    }
  });
  Status result;
  for (size_t i = 0; i < batches.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return filled > i; });
      result = fill_status[i % kBuffers];
    }
    if (result.ok()) result = ConsumeBatch(batches[i], bufs[i % kBuffers].data());
    {
      std::lock_guard<std::mutex> lock(mu);
      ++consumed;
      if (!result.ok()) stop = true;
    }
    cv.notify_all();
    if (!result.ok()) break;
  }
  thread.join();
  return result;
}

// Finished output files are fsynced by a background thread while the pipeline goes on, so
// the final fsyncs find little left to write. All File::Sync calls hold sync_mu_ (Env: Sync
// must not race with other calls on the same File; no other call touches a finished file).
void Packer::StartSyncer() {
  syncer_ = std::thread([this] {
    for (;;) {
      size_t i = 0;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [&] { return queue_done_ || !sync_queue_.empty(); });
        if (sync_queue_.empty()) return;
        i = sync_queue_.front();
        sync_queue_.pop_front();
      }
      Status s;
      {
        std::lock_guard<std::mutex> lock(sync_mu_);
        s = outputs_[i]->Sync();
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(queue_mu_);
        early_sync_failed_.insert(i);
        if (early_sync_status_.ok()) early_sync_status_ = s;
      }
    }
  });
}

void Packer::QueueSync(size_t stream) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    sync_queue_.push_back(stream);
  }
  queue_cv_.notify_all();
}

// Waits for queued fsyncs (their failures surface in FinishOutputs).
void Packer::StopSyncer() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_done_ = true;
  }
  queue_cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
}

void Packer::InitCursors() {
  unit_cursor_.assign(plan_->streams.size(), 0);
}

}  // namespace k3::prep::pack_internal
