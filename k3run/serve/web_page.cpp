#include "k3run/serve/web_page.h"

#include <string>

namespace k3::run {
namespace {

std::string_view ContentType(std::string_view name) {
  const auto ends = [name](std::string_view ext) {
    return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

std::optional<WebAsset> FindWebAsset(std::string_view path) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  const std::string_view name = path == "/" ? std::string_view("chat.html") : path.substr(1);
  for (const EmbeddedFile& f : EmbeddedWebFiles()) {
    if (f.name == name) return WebAsset{f.bytes, ContentType(f.name)};
  }
  return std::nullopt;
}

void RegisterWebPage(httplib::Server& svr) {
  std::vector<std::string> paths = {"/"};
  for (const EmbeddedFile& f : EmbeddedWebFiles()) paths.push_back("/" + std::string(f.name));
  for (const std::string& path : paths) {
    const WebAsset a = *FindWebAsset(path);
    // cpp-httplib's patterns are regular expressions: the names are plain ([a-z.]), the dot
    // escaped.
    std::string pattern;
    for (char c : path) pattern += c == '.' ? std::string("\\.") : std::string(1, c);
    svr.Get(pattern, [a](const httplib::Request&, httplib::Response& res) {
      // A new binary's page replaces a cached one; the page loads nothing but itself (its icon
      // is an empty data: URL, so the browser asks for no /favicon.ico).
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                     "form-action 'none'");
      res.set_content(a.bytes.data(), a.bytes.size(), std::string(a.content_type));
    });
  }
}

}  // namespace k3::run
