#include "k3prep/download/hub.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "common/hex.h"
#include "common/printable.h"
#include "formats/download_manifest.h"
#include "k3prep/download/download.h"

namespace k3::download {
namespace {

using nlohmann::json;

std::string AccessError(const HubContext& hub, long status, const std::string& url) {
  return "token missing or without access to " + hub.repo + " (HTTP " + std::to_string(status) +
         " from " + RedactUrl(url) + "): set HF_TOKEN, HF_TOKEN_PATH or --token-file to a token "
         "that can read the repo, and accept its licence on the Hub if it is gated";
}

// GET an API URL (JSON), retrying transient failures. 401/403 → the token error.
Result<HttpResponse> GetApi(HttpClient& http, const HubContext& hub, const std::string& url,
                            std::mt19937_64& rng) {
  HttpRequest req;
  req.url = url;
  if (SameOrigin(url, hub.endpoint)) req.bearer_token = hub.token;
  req.connect_timeout_s = hub.connect_timeout_s;
  req.low_speed_bytes_per_s = 1;  // an API answer that stops flowing for 60 s is a stall
  req.low_speed_seconds = 60;
  for (int attempt = 0;; ++attempt) {
    K3_ASSIGN_OR_RETURN(HttpResponse resp, http.Perform(req));
    if (resp.curl_code == 0 && resp.status == 200) return resp;
    if (resp.curl_code == 0 && (resp.status == 401 || resp.status == 403)) {
      return Status::Invalid(AccessError(hub, resp.status, url));
    }
    if (resp.curl_code == 0 && resp.status == 404) {
      return Status::Invalid("not found on the Hub: " + RedactUrl(url) + " (HTTP 404): check the "
                             "repo id '" + hub.repo + "' and --revision (a private repo without "
                             "a token also answers 404)");
    }
    const bool retryable = resp.curl_code != 0 ? IsRetryableCurl(resp.curl_code)
                                               : IsRetryableStatus(resp.status);
    const std::string what = resp.curl_code != 0 ? resp.curl_error
                                                 : "HTTP " + std::to_string(resp.status);
    if (!retryable || attempt >= hub.retry.retry_max) {
      return Status::Io("Hub API request " + RedactUrl(url) + " failed: " + what + " (after " +
                        std::to_string(attempt + 1) + " attempts); check the network and " +
                        "HF_ENDPOINT, then run the same command again");
    }
    std::optional<double> wait = ServerWaitSeconds(resp);
    WaitBeforeRetry(hub.retry, wait ? *wait : BackoffSeconds(hub.retry, attempt + 1, rng));
  }
}

// Link: <https://…?cursor=…>; rel="next"
std::string NextLink(const std::string& link) {
  size_t pos = 0;
  while (pos < link.size()) {
    const size_t lt = link.find('<', pos);
    if (lt == std::string::npos) break;
    const size_t gt = link.find('>', lt);
    if (gt == std::string::npos) break;
    const size_t end = link.find(',', gt);
    const std::string params = link.substr(gt + 1, end == std::string::npos ? end : end - gt - 1);
    if (params.find("rel=\"next\"") != std::string::npos ||
        params.find("rel=next") != std::string::npos) {
      return link.substr(lt + 1, gt - lt - 1);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

Result<json> ParseJson(std::string_view body, const std::string& what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::Invalid(what + " is not valid JSON (" +
                           std::to_string(body.size()) + " bytes)");
  }
  return j;
}

// A path as quoted in a message: Printable, with the quote escaped too.
std::string Quoted(const std::string& path) { return "'" + Printable(path, "'") + "'"; }

bool DefaultSelected(const std::string& path) {
  if (path.find('/') != std::string::npos) return false;
  static const std::set<std::string> kNames = {
      "config.json", "generation_config.json", "model.safetensors.index.json", "tiktoken.model",
      "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "chat_template.jinja"};
  if (kNames.count(path) != 0) return true;
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace

bool IsSafeRelativePath(const std::string& path) {
  if (path.empty() || path.size() > 1024 || path[0] == '/') return false;
  // A path must print as itself: no control byte (NUL, newline, ESC… would forge log lines
  // or drive a terminal when the name is printed), no C1 control, no ill-formed UTF-8, and no
  // backslash (a separator elsewhere). No real checkpoint file name has any of them.
  if (Printable(path) != path) return false;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string comp = path.substr(start, slash == std::string::npos ? slash : slash - start);
    if (comp.empty() || comp == "." || comp == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool IsReservedName(const std::string& path) {
  const std::string manifest(dl::kFileName);
  const std::string partial(kPartialDir);
  return path == manifest || path == TempPathFor(manifest) || path == partial ||
         path.rfind(partial + "/", 0) == 0;
}

bool IsValidRepoId(const std::string& repo) {
  if (repo.empty() || repo.size() > 200 || repo.find("..") != std::string::npos) return false;
  int slashes = 0;
  for (char c : repo) {
    if (c == '/') {
      ++slashes;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return slashes <= 1 && repo.front() != '/' && repo.back() != '/';
}

Result<std::string> ResolveCommit(HttpClient& http, const HubContext& hub, const std::string& rev,
                                  std::mt19937_64& rng) {
  const std::string url = hub.endpoint + "/api/models/" + hub.repo + "/revision/" +
                          UrlEscape(rev, /*keep_slash=*/false);
  K3_ASSIGN_OR_RETURN(HttpResponse resp, GetApi(http, hub, url, rng));
  K3_ASSIGN_OR_RETURN(json j, ParseJson(resp.body, "Hub answer from " + RedactUrl(url)));
  if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string() ||
      !IsLowerHex(j["sha"].get<std::string>(), 40)) {
    return Status::Invalid("Hub answer from " + RedactUrl(url) +
                           ": field \"sha\" must be a 40-digit lowercase hex commit");
  }
  const std::string sha = j["sha"].get<std::string>();
  if (IsLowerHex(rev, 40) && sha != rev) {
    return Status::Invalid("Hub resolved revision " + rev + " to a different commit " + sha);
  }
  return sha;
}

Result<std::vector<HubFile>> ParseTreePage(std::string_view body, int page,
                                           const std::string& url) {
  const std::string page_name = "tree listing page " + std::to_string(page) + " (" +
                                RedactUrl(url) + ")";
  K3_ASSIGN_OR_RETURN(json j, ParseJson(body, page_name));
  if (!j.is_array()) return Status::Invalid(page_name + " is not a JSON array");
  std::vector<HubFile> files;
  std::set<std::string> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    const std::string where = page_name + " entry " + std::to_string(i);
    if (!e.is_object() || !e.contains("type") || !e["type"].is_string() ||
        !e.contains("path") || !e["path"].is_string()) {
      return Status::Invalid(where + ": needs string fields \"type\" and \"path\"");
    }
    if (e["type"] != "file") continue;
    HubFile f;
    f.path = e["path"].get<std::string>();
    if (!IsSafeRelativePath(f.path)) {
      return Status::Invalid(where + ": path " + Quoted(f.path) + " is not a safe relative path "
                             "(absolute, '..', '.' or empty component, backslash, control "
                             "character or ill-formed UTF-8); refusing to write it");
    }
    const std::string at = where + " (" + f.path + ")";
    if (!e.contains("size") || !e["size"].is_number_unsigned()) {
      return Status::Invalid(at + ": \"size\" must be an unsigned integer");
    }
    f.size = e["size"].get<uint64_t>();
    if (f.size > kMaxListedFileBytes) {
      return Status::Invalid(at + ": \"size\" " + std::to_string(f.size) + " is more than 2^50 "
                             "bytes (1 PiB), the most k3prep accepts for one file; the Hub's "
                             "listing is broken");
    }
    if (!e.contains("oid") || !e["oid"].is_string() ||
        !IsLowerHex(e["oid"].get<std::string>(), 40)) {
      return Status::Invalid(at + ": \"oid\" must be 40 lowercase hex");
    }
    f.git_oid = e["oid"].get<std::string>();
    if (e.contains("lfs") && !e["lfs"].is_null()) {
      const json& l = e["lfs"];
      if (!l.is_object() || !l.contains("oid") || !l["oid"].is_string() ||
          !IsLowerHex(l["oid"].get<std::string>(), 64) || !l.contains("size") ||
          !l["size"].is_number_unsigned()) {
        return Status::Invalid(at + ": \"lfs\" needs \"oid\" (64 lowercase hex sha256) and "
                               "an unsigned \"size\"");
      }
      if (l["size"].get<uint64_t>() != f.size) {
        return Status::Invalid(at + ": lfs.size " + std::to_string(l["size"].get<uint64_t>()) +
                               " != size " + std::to_string(f.size));
      }
      f.sha256 = l["oid"].get<std::string>();
    }
    if (!seen.insert(f.path).second) {
      return Status::Invalid(where + ": path '" + f.path + "' listed twice on the page");
    }
    files.push_back(std::move(f));
  }
  return files;
}

Result<std::vector<HubFile>> ListTree(HttpClient& http, const HubContext& hub,
                                      const std::string& commit, std::mt19937_64& rng) {
  std::string url = hub.endpoint + "/api/models/" + hub.repo + "/tree/" + commit +
                    "?recursive=true";
  // Pages fetched so far, in libcurl's normal form, so that a Link back to any of them is
  // seen as the loop it is (a self-link of an empty page would otherwise run to the cap).
  std::set<std::string> fetched = {ResolveLocation(url, url)};
  std::vector<HubFile> files;
  std::set<std::string> seen;
  for (int page = 0; !url.empty(); ++page) {
    if (page >= kMaxTreePages) {
      return Status::Invalid("tree listing of " + hub.repo + " has more than " +
                             std::to_string(kMaxTreePages) + " pages; the Hub's paging is "
                             "broken (stopped at " + RedactUrl(url) + ")");
    }
    K3_ASSIGN_OR_RETURN(HttpResponse resp, GetApi(http, hub, url, rng));
    K3_ASSIGN_OR_RETURN(std::vector<HubFile> page_files, ParseTreePage(resp.body, page, url));
    for (HubFile& f : page_files) {
      if (!seen.insert(f.path).second) {
        return Status::Invalid("tree listing page " + std::to_string(page) + " (" +
                               RedactUrl(url) + "): path '" + f.path +
                               "' listed twice (also on an earlier page)");
      }
      files.push_back(std::move(f));
    }
    const std::string next = NextLink(resp.Header("link"));
    if (next.empty()) break;
    const std::string abs = ResolveLocation(url, next);
    // The token goes only to the endpoint; a next page elsewhere is refused, not followed.
    if (!SameOrigin(abs, hub.endpoint)) {
      return Status::Invalid("tree listing's next page " + RedactUrl(abs.empty() ? next : abs) +
                             " is not on the endpoint " + RedactUrl(hub.endpoint) +
                             "; refusing to follow");
    }
    K3_RETURN_IF_ERROR(CheckFollowTarget(hub.endpoint, abs, "tree listing page " +
                                         std::to_string(page + 1)));
    if (!fetched.insert(abs).second) {
      return Status::Invalid("tree listing page " + std::to_string(page) + " (" + RedactUrl(url) +
                             ") links to " + RedactUrl(abs) + " as its next page, which was "
                             "already fetched; the Hub's paging loops, so the listing cannot be "
                             "trusted to be complete: try again later or report it to the Hub");
    }
    url = abs;
  }
  std::sort(files.begin(), files.end(),
            [](const HubFile& a, const HubFile& b) { return a.path < b.path; });
  return files;
}

Result<std::vector<HubFile>> SelectFiles(const std::vector<HubFile>& all,
                                         const std::vector<std::string>& includes,
                                         const std::string& repo, const std::string& commit) {
  std::vector<HubFile> out;
  std::vector<bool> used(includes.size(), false);
  bool any_shard = false;
  for (const HubFile& f : all) {
    bool take = DefaultSelected(f.path);
    for (size_t i = 0; i < includes.size(); ++i) {
      if (fnmatch(includes[i].c_str(), f.path.c_str(), 0) == 0) {
        used[i] = true;
        take = true;
        // Downloading it would overwrite k3prep's own manifest, lock or parts.
        if (IsReservedName(f.path)) {
          return Status::Invalid("--include '" + includes[i] + "' selects " + f.path + " of " +
                                 repo + ", a name reserved by k3prep for its own " +
                                 (f.path.rfind(kPartialDir, 0) == 0 ? "partial files and lock"
                                                                    : "download manifest") +
                                 " in --dest; narrow the pattern so it does not match it");
        }
      }
    }
    if (f.path.find('/') == std::string::npos && f.path.size() > 12 &&
        f.path.compare(f.path.size() - 12, 12, ".safetensors") == 0) {
      any_shard = true;
    }
    if (take) out.push_back(f);
  }
  for (size_t i = 0; i < includes.size(); ++i) {
    if (!used[i]) {
      return Status::Invalid("--include '" + includes[i] + "' matches no file of " + repo +
                             " at " + commit + " (" + std::to_string(all.size()) +
                             " files listed); check the pattern ('*' also matches '/')");
    }
  }
  if (!any_shard) {
    return Status::Invalid(repo + " at " + commit + " has no top-level *.safetensors shard (" +
                           std::to_string(all.size()) + " files listed); is this a model repo?");
  }
  // Each listed size is at most 2^50 (ParseTreePage), but their sum must fit in 64 bits too: a
  // wrapped total would pass the free-space check with a few KiB and start the downloads.
  uint64_t total = 0;
  for (const HubFile& f : out) {
    if (__builtin_add_overflow(total, f.size, &total)) {
      return Status::Invalid("the files selected from " + repo + " at " + commit +
                             " add up to more than 2^64 bytes (at " + f.path + ", " +
                             std::to_string(f.size) + " bytes); the Hub's listing is broken");
    }
  }
  return out;
}

std::string ResolveUrl(const HubContext& hub, const std::string& commit,
                       const std::string& path) {
  return hub.endpoint + "/" + hub.repo + "/resolve/" + commit + "/" +
         UrlEscape(path, /*keep_slash=*/true);
}

}  // namespace k3::download
