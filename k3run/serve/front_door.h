// The server's front door: one thread that owns the listening socket and every connection
// while its request is still arriving, so that a slow client holds a few bytes of memory here,
// never a worker (DESIGN.md §11.5; docs/SERVER.md "Slow clients").
//
// A connection is in one of two places:
//   - here, reading: its request (head, then body) must arrive whole within its deadlines
//     (FrontDoorLimits); past one it gets 408 and is closed (closed silently when nothing of a
//     request came: an idle keep-alive connection). GET /health is answered here, in this
//     thread, from the `health` handler: no slow client and no busy worker can delay it.
//   - at a worker (`dispatch`), with the whole request in memory; the worker gives it back with
//     Resume (keep-alive: read the next request here) or ends it with Close.
// At most max_connections connections are open, wherever they are: a new one beyond that
// evicts the connection here that has waited longest for its request (503), or, when every
// connection is at a worker, is itself answered 503 and closed.
//
// Thread safety: Resume, Close and Stop may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"

namespace k3::run {

struct FrontDoorLimits {
  double head_seconds = 5;      // a request's head, from when the connection was ready for it
  double body_seconds = 30;     // its body, from the end of its head
  int max_connections = 256;    // open connections, reading here or at a worker
  size_t max_head_bytes = size_t{64} << 10;
  uint64_t max_body_bytes = uint64_t{4} << 20;
};

// A connection whose request has arrived whole.
struct GatedConnection {
  int fd = -1;
  std::string bytes;         // the request, then whatever the client sent after it (pipelined)
  size_t request_bytes = 0;  // the request's length in `bytes`
};

class FrontDoor {
 public:
  struct Handlers {
    // GET /health: the status code and JSON body. Called on the front door's thread.
    std::function<std::pair<int, std::string>()> health;
    // The JSON body of an error the front door answers itself (status, sentence).
    std::function<std::string(int, const std::string&)> error_body;
    // A whole request; must end with door->Resume or door->Close (from any thread).
    std::function<void(FrontDoor* door, std::shared_ptr<GatedConnection>)> dispatch;
  };

  // Listens on host:port (0: any free port) with SO_REUSEADDR; *bound_port: the port.
  static Result<int> Listen(const std::string& host, int port, int* bound_port);
  // Takes `listen_fd` (from Listen) and starts the thread.
  static Result<std::unique_ptr<FrontDoor>> Start(int listen_fd, const FrontDoorLimits& limits,
                                                  Handlers handlers);
  ~FrontDoor();  // Stop()

  // The worker has answered c's request: read the next one (the consumed request has been
  // erased from c->bytes). After Stop: closes it.
  void Resume(std::shared_ptr<GatedConnection> c);
  // The worker is done with c: close it.
  void Close(std::shared_ptr<GatedConnection> c);
  // Stops accepting, closes the listening socket and every connection here, joins the thread.
  // Connections at workers stay theirs (Resume then closes them).
  void Stop();

 private:
  struct Reading;
  FrontDoor(int listen_fd, int wake_fd, int epoll_fd, const FrontDoorLimits& limits,
            Handlers handlers);
  void Loop();
  void Accept();
  void Admit(int fd, std::string bytes);
  void OnReadable(int fd);
  void Advance(int fd);
  void Expire();
  void Answer(int fd, int status, const std::string& reason);
  void Drop(int fd);
  bool EvictOldest();

  const int listen_fd_, wake_fd_, epoll_fd_;
  const FrontDoorLimits limits_;
  const Handlers handlers_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_{0};  // connections here or at a worker
  // Owned by the loop's thread: the connections reading here, by fd.
  std::vector<std::unique_ptr<Reading>> reading_;  // indexed by fd
  std::mutex mu_;
  std::vector<std::shared_ptr<GatedConnection>> resumed_;  // from workers, under mu_
  bool stopped_ = false;                                   // under mu_
};

}  // namespace k3::run
