#include "k3run/serve/gated_http.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "k3run/serve/client_socket.h"

namespace k3::run {
namespace {

// Reads serve the request bytes (never past them: what follows is the next request's); writes
// go to the socket, waiting at most write_seconds whenever it is full.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(GatedConnection* c, double write_seconds)
      : c_(c), write_ms_(static_cast<int>(write_seconds * 1000)) {}

  bool is_readable() const override { return read_ < c_->request_bytes; }

  bool is_writable() const override {
    pollfd p = {c_->fd, POLLOUT | POLLRDHUP, 0};
    const int n = ::poll(&p, 1, write_ms_);
    return n > 0 && (p.revents & POLLOUT) != 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_->request_bytes - read_);
    c_->bytes.copy(ptr, n, read_);
    read_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::send(c_->fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p = {c_->fd, POLLOUT, 0};
        if (::poll(&p, 1, write_ms_) > 0 && (p.revents & POLLOUT) != 0) continue;
      }
      failed_ = true;
      return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    if (!SocketAddress(c_->fd, /*peer=*/true, &ip, &port)) port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    if (!SocketAddress(c_->fd, /*peer=*/false, &ip, &port)) port = 0;
  }
  socket_t socket() const override { return c_->fd; }

  bool failed() const { return failed_; }

 private:
  GatedConnection* c_;
  const int write_ms_;
  size_t read_ = 0;
  bool failed_ = false;
};

}  // namespace

bool GatedHttpServer::Serve(GatedConnection* c, double write_seconds) {
  ConnectionStream stream(c, write_seconds);
  bool closed = false;
  const bool ok = process_request(stream, /*close_connection=*/false, closed, nullptr);
  c->bytes.erase(0, c->request_bytes);
  c->request_bytes = 0;
  return ok && !closed && !stream.failed();
}

}  // namespace k3::run
