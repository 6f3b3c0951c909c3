#include "tests/support/fault_env.h"

#include <algorithm>
#include <cerrno>

namespace k3::test {
namespace {

class FaultFile final : public File {
 public:
  FaultFile(std::unique_ptr<File> base, std::shared_ptr<FaultEnv::RuleState> state)
      : base_(std::move(base)), state_(std::move(state)) {
    path_ = base_->path();
  }

  Status PRead(uint64_t offset, size_t n, void* dst, size_t* got) override {
    *got = 0;
    const FaultRule& rule = state_->rule;
    if (rule.before_read) rule.before_read(offset, n);
    if (rule.truncated_size) {
      if (offset >= *rule.truncated_size) return Status::Ok();
      n = static_cast<size_t>(std::min<uint64_t>(n, *rule.truncated_size - offset));
    }
    if (rule.eio_read_offset && n > 0 && *rule.eio_read_offset >= offset &&
        *rule.eio_read_offset < offset + n) {
      return Status::IoErrno("read", path_, EIO, *rule.eio_read_offset);
    }
    if (rule.max_read_chunk) {
      // O_DIRECT rejects unaligned lengths, so a direct file's short reads come in whole
      // 4 KiB blocks (as a real device's would).
      size_t chunk = *rule.max_read_chunk;
      if (base_->direct()) chunk = std::max<size_t>(4096, chunk / 4096 * 4096);
      n = std::min(n, chunk);
    }
    return base_->PRead(offset, n, dst, got);
  }

  Status PWrite(uint64_t offset, const void* src, size_t n, size_t* wrote) override {
    *wrote = 0;
    const FaultRule& rule = state_->rule;
    if (rule.enospc_after_bytes) {
      const uint64_t used = state_->written.load();
      if (used >= *rule.enospc_after_bytes && n > 0) {
        return Status::IoErrno("write", path_, ENOSPC, offset);
      }
      n = static_cast<size_t>(std::min<uint64_t>(n, *rule.enospc_after_bytes - used));
    }
    K3_RETURN_IF_ERROR(base_->PWrite(offset, src, n, wrote));
    state_->written += *wrote;
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    K3_ASSIGN_OR_RETURN(uint64_t size, base_->Size());
    if (state_->rule.truncated_size) return std::min(size, *state_->rule.truncated_size);
    return size;
  }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Status Sync() override {
    if (state_->rule.fail_sync) return Status::IoErrno("fsync", path_, EIO);
    return base_->Sync();
  }
  Status Close() override { return base_->Close(); }
  int fd() const override { return -1; }
  bool direct() const override { return base_->direct(); }

 private:
  std::unique_ptr<File> base_;
  std::shared_ptr<FaultEnv::RuleState> state_;
};

}  // namespace

void FaultEnv::SetRule(const std::string& path_prefix, FaultRule rule) {
  auto state = std::make_shared<RuleState>();
  state->rule = rule;
  std::lock_guard<std::mutex> lock(mu_);
  rules_[path_prefix] = std::move(state);
}

void FaultEnv::ClearRules() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

void FaultEnv::SetFreeSpace(std::optional<uint64_t> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  free_space_ = bytes;
}

uint64_t FaultEnv::BytesWritten(const std::string& path_prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rules_.find(path_prefix);
  return it == rules_.end() ? 0 : it->second->written.load();
}

std::shared_ptr<FaultEnv::RuleState> FaultEnv::Find(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<RuleState> best;
  size_t best_len = 0;
  for (const auto& [key, state] : rules_) {
    if (path.compare(0, key.size(), key) == 0 && key.size() >= best_len) {
      best = state;
      best_len = key.size();
    }
  }
  return best;
}

Result<std::unique_ptr<File>> FaultEnv::Open(const std::string& path, OpenMode mode) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<File> base, target()->Open(path, mode));
  auto state = Find(path);
  // Files without a rule still get fd() == -1, so every test path through FaultEnv exercises
  // the PRead fallback consistently.
  if (!state) state = std::make_shared<RuleState>();
  return std::unique_ptr<File>(new FaultFile(std::move(base), std::move(state)));
}

Result<uint64_t> FaultEnv::FileSize(const std::string& path) {
  K3_ASSIGN_OR_RETURN(uint64_t size, target()->FileSize(path));
  auto state = Find(path);
  if (state && state->rule.truncated_size) return std::min(size, *state->rule.truncated_size);
  return size;
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  for (const std::string* p : {&from, &to}) {
    auto state = Find(*p);
    if (state && state->rule.fail_rename) return Status::IoErrno("rename to " + to, from, EIO);
  }
  return target()->Rename(from, to);
}

Status FaultEnv::Remove(const std::string& path) {
  auto state = Find(path);
  if (state && state->rule.fail_remove) return Status::IoErrno("remove", path, EIO);
  return target()->Remove(path);
}

Result<uint64_t> FaultEnv::FreeSpace(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_space_) return *free_space_;
  }
  return target()->FreeSpace(path);
}

}  // namespace k3::test
