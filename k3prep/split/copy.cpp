// Verified copy of one split output file (see k3prep/split/copy.h).
#include "k3prep/split/copy.h"

#include <algorithm>
#include <memory>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"

namespace k3::prep::split_internal {
namespace {

// Large enough that a multi-GB region is a few hundred reads, small enough for any machine.
constexpr uint64_t kChunk = uint64_t{8} << 20;

struct Source {
  std::unique_ptr<File> file;
  uint32_t align = 0;
};

Status Mismatch(const std::string& path, const CopyItem& it, const std::string& got,
                const std::string& want) {
  return Status::Integrity(path + ": " + it.label + " at byte offset " +
                           std::to_string(it.src_offset) + " (+" + std::to_string(it.length) +
                           " bytes): " + (it.check == CopyCheck::kXxh3_128 ? "XXH3-128" : "XXH3-64") +
                           " is " + got + ", " + it.want_from + " records " + want +
                           " (the source directory changed after it was written; k3verify "
                           "prepared --deep names every such range); nothing was split");
}

// Reads, hashes and appends one item.
Status CopyItemBytes(const CopyJob& job, const CopyItem& it, Source* src, AlignedBuffer* buf,
                     BufferedWriter* out, Progress* progress, CopyStats* stats) {
  const std::string& path = job.sources[it.source];
  Xxh3_128Stream h128;
  Xxh3_64Stream h64;
  for (uint64_t done = 0; done < it.length;) {
    const uint64_t n = std::min(kChunk, it.length - done);
    K3_RETURN_IF_ERROR(DirectRead(src->file.get(), src->align, it.src_offset + done, n, buf->data())
                           .WithContext(path + ": " + it.label));
    if (it.check == CopyCheck::kXxh3_128) {
      h128.Update(buf->data(), static_cast<size_t>(n));
    } else {
      h64.Update(buf->data(), static_cast<size_t>(n));
    }
    K3_RETURN_IF_ERROR(out->Append(buf->data(), static_cast<size_t>(n)));
    stats->bytes_read += n;
    progress->Add(n);
    done += n;
  }
  if (it.check == CopyCheck::kXxh3_128) {
    const Hash128 got = h128.Digest();
    if (got != it.want128) return Mismatch(path, it, got.Hex(), it.want128.Hex());
  } else {
    const uint64_t got = h64.Digest();
    if (got != it.want64) return Mismatch(path, it, Hex64(got), Hex64(it.want64));
  }
  return Status::Ok();
}

}  // namespace

Status CopyVerified(Env* env, const CopyJob& job, Progress* progress, CopyStats* stats) {
  progress->SetStatus(job.status);
  std::vector<Source> sources(job.sources.size());
  for (size_t i = 0; i < job.sources.size(); ++i) {
    K3_ASSIGN_OR_RETURN(sources[i].file, env->Open(job.sources[i], OpenMode::kReadDirect));
    sources[i].align = env->DirectAlignment(job.sources[i]);
  }
  K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(kChunk, 4096));
  const std::string tmp = TempPathFor(job.final_path);
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(tmp, OpenMode::kCreate));
  BufferedWriter out(file.get());
  for (const CopyItem& it : job.items) {
    if (it.dst_offset < out.offset() || it.dst_offset + it.length > job.size) {
      return Status::Invalid("internal: split item " + it.label + " does not fit " +
                             job.final_path + " at " + std::to_string(it.dst_offset) +
                             " (please report)");
    }
    K3_RETURN_IF_ERROR(out.AppendZeros(static_cast<size_t>(it.dst_offset - out.offset())));
    K3_RETURN_IF_ERROR(
        CopyItemBytes(job, it, &sources[it.source], &buf, &out, progress, stats));
  }
  K3_RETURN_IF_ERROR(out.AppendZeros(static_cast<size_t>(job.size - out.offset())));
  K3_RETURN_IF_ERROR(out.Flush());
  stats->bytes_written += job.size;
  K3_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace k3::prep::split_internal
