// The built-in chat page of `k3run --serve --web` (docs/SERVER.md "Web chat page"): the files of
// k3run/serve/web (chat.html, chat.css, chat.js), embedded in the binary at build time by
// cmake/EmbedFiles.cmake, so the server never reads the source tree. The page holds no data and
// is served without the API key; it sends the key of its settings as a bearer header.
// Thread safety: everything here is immutable after static initialisation.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <httplib.h>

namespace k3::run {

// One embedded file: its name in k3run/serve/web and its bytes.
struct EmbeddedFile {
  std::string_view name;
  std::string_view bytes;
};
// Every embedded file (defined by the generated web_files.cpp).
const std::vector<EmbeddedFile>& EmbeddedWebFiles();

struct WebAsset {
  std::string_view bytes;
  std::string_view content_type;
};
// What GET `path` serves: "/" is chat.html, "/NAME" an embedded file; nullopt otherwise.
std::optional<WebAsset> FindWebAsset(std::string_view path);

// GET / and GET /NAME of each embedded file (HEAD too, as cpp-httplib answers it for GET routes).
void RegisterWebPage(httplib::Server& svr);

}  // namespace k3::run
