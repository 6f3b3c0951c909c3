#include "k3run/app/logits_dump.h"

namespace k3::run {

Result<std::unique_ptr<LogitsDump>> LogitsDump::Open(Env* env, const std::string& path) {
  auto d = std::unique_ptr<LogitsDump>(new LogitsDump(env, path));
  K3_ASSIGN_OR_RETURN(d->file_, env->Open(TempPathFor(path), OpenMode::kCreate));
  d->writer_ = std::make_unique<BufferedWriter>(d->file_.get());
  return d;
}

LogitsDump::~LogitsDump() {
  if (!done_) {
    writer_.reset();
    file_.reset();
    (void)env_->Remove(TempPathFor(path_));
  }
}

Status LogitsDump::Append(const float* logits, int64_t n) {
  return writer_->Append(logits, static_cast<size_t>(n) * sizeof(float));
}

Status LogitsDump::Finish() {
  K3_RETURN_IF_ERROR(writer_->Flush());
  K3_RETURN_IF_ERROR(file_->Sync());
  K3_RETURN_IF_ERROR(file_->Close());
  K3_RETURN_IF_ERROR(env_->Rename(TempPathFor(path_), path_));
  done_ = true;
  return Status::Ok();
}

}  // namespace k3::run
