// Fuzz target for the Hub's tree listing parser (k3prep/download/hub.h ParseTreePage): it must
// never crash, refuse only with kInvalid (exit 2, a malformed Hub answer), and every file it
// accepts must keep the rules the downloader relies on afterwards. A violated property aborts,
// which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "common/printable.h"
#include "k3prep/download/hub.h"

namespace {

bool LowerHex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using k3::download::HubFile;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  k3::Result<std::vector<HubFile>> page =
      k3::download::ParseTreePage(body, 0, "http://127.0.0.1:1/api/models/o/m/tree/c");
  if (!page.ok()) {
    if (page.status().code() != k3::Code::kInvalid) std::abort();
    return 0;
  }
  std::set<std::string> paths;
  for (const HubFile& f : *page) {
    // The path names a file under --dest and is printed as is.
    if (!k3::download::IsSafeRelativePath(f.path)) std::abort();
    if (k3::Printable(f.path) != f.path) std::abort();
    if (!paths.insert(f.path).second) std::abort();
    // Sizes are summed for the free-space check; the bound keeps that from wrapping.
    if (f.size > k3::download::kMaxListedFileBytes) std::abort();
    // The integrity reference: the git blob sha1 always, the LFS sha256 when present.
    if (!LowerHex(f.git_oid, 40)) std::abort();
    if (!f.sha256.empty() && !LowerHex(f.sha256, 64)) std::abort();
  }
  return 0;
}
