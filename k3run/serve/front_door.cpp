#include "k3run/serve/front_door.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "k3run/serve/request_head.h"

namespace k3::run {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t SecondsNs(double s) { return static_cast<int64_t>(s * 1e9); }

const char* StatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Response(int status, const std::string& body, bool keep_alive) {
  return "HTTP/1.1 " + std::to_string(status) + " " + StatusText(status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         (keep_alive ? "\r\nConnection: keep-alive" : "\r\nConnection: close") + "\r\n\r\n" + body;
}

// One non-blocking send of a short response; false when the socket did not take all of it
// (a client that does not read is not waited for here).
bool SendNow(int fd, const std::string& text) {
  const ssize_t n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(text.size());
}

bool IsHealth(const RequestHead& h) {
  return h.method == "GET" && (h.target == "/health" || h.target.rfind("/health?", 0) == 0);
}

}  // namespace

// A connection reading its request here.
struct FrontDoor::Reading {
  std::string bytes;
  int64_t since_ns = 0;     // when it became ready for this request
  int64_t deadline_ns = 0;  // for the head, then for the body
  bool head_done = false;
  RequestHead head;         // when head_done
  // Answered with an error and shut for writing: what still arrives is read and dropped until
  // the client closes or a second passes, so that closing with unread bytes does not reset
  // the connection before the client has read the answer.
  bool closing = false;
};

Result<int> FrontDoor::Listen(const std::string& host, int port, int* bound_port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return Status::Io("cannot listen on " + host + ":" + service + " (not an address of this "
                      "machine)");
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // SO_REUSEADDR allows a quick restart; SO_REUSEPORT (cpp-httplib's default) is left off: it
    // would let a second server bind a port in use and share its connections.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return Status::Io("cannot listen on " + host + ":" + service + " (" + std::strerror(err) +
                      ": in use, or not an address of this machine)");
  }
  sockaddr_storage a = {};
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  *bound_port = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  return fd;
}

Result<std::unique_ptr<FrontDoor>> FrontDoor::Start(int listen_fd, const FrontDoorLimits& limits,
                                                    Handlers handlers) {
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Status::IoErrno("eventfd", "server front door", errno);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    const int e = errno;
    ::close(wake);
    return Status::IoErrno("epoll_create1", "server front door", e);
  }
  for (int fd : {listen_fd, wake}) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  std::unique_ptr<FrontDoor> d(new FrontDoor(listen_fd, wake, ep, limits, std::move(handlers)));
  d->thread_ = std::thread([p = d.get()] { p->Loop(); });
  return d;
}

FrontDoor::FrontDoor(int listen_fd, int wake_fd, int epoll_fd, const FrontDoorLimits& limits,
                     Handlers handlers)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), epoll_fd_(epoll_fd), limits_(limits),
      handlers_(std::move(handlers)) {}

FrontDoor::~FrontDoor() {
  Stop();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void FrontDoor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void FrontDoor::Resume(std::shared_ptr<GatedConnection> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      resumed_.push_back(std::move(c));
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
      return;
    }
  }
  Close(std::move(c));
}

void FrontDoor::Close(std::shared_ptr<GatedConnection> c) {
  ::shutdown(c->fd, SHUT_RDWR);
  ::close(c->fd);
  c->fd = -1;
  open_.fetch_sub(1);
}

void FrontDoor::Loop() {
  while (!stop_.load()) {
    epoll_event events[64];
    // The 100 ms tick bounds how late a deadline is noticed; the waits are epoll's.
    const int n = ::epoll_wait(epoll_fd_, events, 64, 100);
    for (int i = 0; i < n && !stop_.load(); ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept();
      } else if (fd == wake_fd_) {
        uint64_t count = 0;
        (void)!::read(wake_fd_, &count, sizeof count);
        std::vector<std::shared_ptr<GatedConnection>> back;
        {
          std::lock_guard<std::mutex> lock(mu_);
          back.swap(resumed_);
        }
        for (auto& c : back) Admit(c->fd, std::move(c->bytes));
      } else if (fd >= 0 && static_cast<size_t>(fd) < reading_.size() && reading_[fd]) {
        OnReadable(fd);
      }
    }
    Expire();
  }
  for (size_t fd = 0; fd < reading_.size(); ++fd) {
    if (reading_[fd]) Drop(static_cast<int>(fd));
  }
  ::close(listen_fd_);
}

void FrontDoor::Accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors: free one if a reading connection can go, else let the listen
      // backlog hold the client until one is closed.
      if ((errno == EMFILE || errno == ENFILE) && EvictOldest()) continue;
      return;
    }
    if (open_.load() >= limits_.max_connections && !EvictOldest()) {
      (void)SendNow(fd, Response(503, handlers_.error_body(503, "too many connections: every one "
                                                           "of the server's " +
                                                           std::to_string(limits_.max_connections) +
                                                           " has a request in progress; retry"),
                                 false));
      ::close(fd);
      continue;
    }
    open_.fetch_add(1);
    int yes = 1;  // streamed tokens go out as they come
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    Admit(fd, std::string());
  }
}

void FrontDoor::Admit(int fd, std::string bytes) {
  if (static_cast<size_t>(fd) >= reading_.size()) reading_.resize(static_cast<size_t>(fd) + 1);
  auto r = std::make_unique<Reading>();
  r->bytes = std::move(bytes);
  r->since_ns = NowNs();
  r->deadline_ns = r->since_ns + SecondsNs(limits_.head_seconds);
  reading_[fd] = std::move(r);
  epoll_event ev = {};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  Advance(fd);  // a pipelined request may be here already
}

void FrontDoor::OnReadable(int fd) {
  Reading& r = *reading_[fd];
  char chunk[64 << 10];
  bool eof = false;
  for (;;) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n > 0 && r.closing) continue;
    if (n > 0) {
      r.bytes.append(chunk, static_cast<size_t>(n));
      // Enough for any acceptable request: past it the scan refuses, without reading more.
      if (r.bytes.size() > limits_.max_head_bytes + limits_.max_body_bytes) break;
      continue;
    }
    if (n == 0) eof = true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) eof = true;
    break;
  }
  if (r.closing) {
    if (eof) Drop(fd);
    return;
  }
  Advance(fd);
  // The client has sent all it will: a request it completed has been answered or dispatched.
  if (eof && static_cast<size_t>(fd) < reading_.size() && reading_[fd]) Drop(fd);
}

void FrontDoor::Advance(int fd) {
  for (;;) {
    Reading& r = *reading_[fd];
    if (!r.head_done) {
      RequestHead h = ScanRequestHead(r.bytes, limits_.max_head_bytes, limits_.max_body_bytes);
      if (h.state == RequestHead::State::kIncomplete) return;
      if (h.state == RequestHead::State::kRefused) {
        return Answer(fd, h.status, h.reason);
      }
      // cpp-httplib reads the request line first: the empty lines before it go. An
      // "Expect: 100-continue" is answered here, so the body comes while no worker waits.
      if (h.expect_end != 0) {
        r.bytes.erase(h.expect_begin, h.expect_end - h.expect_begin);
        h.head_bytes -= h.expect_end - h.expect_begin;
        if (r.bytes.size() < h.head_bytes + h.content_length &&
            !SendNow(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
          return Drop(fd);
        }
      }
      r.bytes.erase(0, h.skipped);
      h.head_bytes -= h.skipped;
      r.head = std::move(h);
      r.head_done = true;
      r.deadline_ns = NowNs() + SecondsNs(limits_.body_seconds);
    }
    const size_t whole = r.head.head_bytes + static_cast<size_t>(r.head.content_length);
    if (r.bytes.size() < whole) return;
    if (IsHealth(r.head)) {
      const auto [status, body] = handlers_.health();
      if (!SendNow(fd, Response(status, body, true))) return Drop(fd);
      r.bytes.erase(0, whole);
      r.head_done = false;
      r.since_ns = NowNs();
      r.deadline_ns = r.since_ns + SecondsNs(limits_.head_seconds);
      continue;
    }
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    auto c = std::make_shared<GatedConnection>();
    c->fd = fd;
    c->bytes = std::move(r.bytes);
    c->request_bytes = whole;
    reading_[fd].reset();
    handlers_.dispatch(this, std::move(c));
    return;
  }
}

void FrontDoor::Expire() {
  const int64_t now = NowNs();
  for (size_t i = 0; i < reading_.size(); ++i) {
    if (!reading_[i] || reading_[i]->deadline_ns > now) continue;
    const int fd = static_cast<int>(i);
    const Reading& r = *reading_[i];
    // Closing and its second is up, or idle: nothing of a request came.
    if (r.closing || (r.bytes.empty() && !r.head_done)) {
      Drop(fd);
      continue;
    }
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g s", r.head_done ? limits_.body_seconds
                                                           : limits_.head_seconds);
    Answer(fd, 408, std::string(r.head_done ? "the request body" : "the request head") +
                        " did not arrive within " + limit);
  }
}

bool FrontDoor::EvictOldest() {
  // A closing connection goes first (it has had its answer), else the one waiting longest.
  int oldest = -1;
  for (size_t i = 0; i < reading_.size(); ++i) {
    const Reading* r = reading_[i].get();
    if (r == nullptr) continue;
    const Reading* o = oldest < 0 ? nullptr : reading_[oldest].get();
    if (o == nullptr || (r->closing && !o->closing) ||
        (r->closing == o->closing && r->since_ns < o->since_ns)) {
      oldest = static_cast<int>(i);
    }
  }
  if (oldest < 0) return false;
  if (reading_[oldest]->closing) {
    Drop(oldest);
    return true;
  }
  Answer(oldest, 503, "too many connections: this one waited longest for its request");
  return true;
}

void FrontDoor::Answer(int fd, int status, const std::string& reason) {
  (void)SendNow(fd, Response(status, handlers_.error_body(status, reason), false));
  ::shutdown(fd, SHUT_WR);
  Reading& r = *reading_[fd];
  r.closing = true;
  r.bytes.clear();
  r.deadline_ns = NowNs() + SecondsNs(1);
}

void FrontDoor::Drop(int fd) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  reading_[fd].reset();
  open_.fetch_sub(1);
}

}  // namespace k3::run
