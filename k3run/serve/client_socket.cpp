#include "k3run/serve/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>

namespace k3::run {
namespace {

// "a.b.c.d" or the IPv6 text form, and the port, of a socket address; false for other families.
bool AddressAndPort(const sockaddr_storage& a, std::string* addr, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    if (::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  *addr = text;
  return true;
}

// Whether `fd` is a socket connected from local:lport to remote:rport.
bool Matches(int fd, const std::string& local, int lport, const std::string& remote, int rport) {
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  std::string addr;
  int port = 0;
  if (!SocketAddress(fd, false, &addr, &port) || port != lport || addr != local) return false;
  return SocketAddress(fd, true, &addr, &port) && port == rport && addr == remote;
}

}  // namespace

bool SocketAddress(int fd, bool peer, std::string* addr, int* port) {
  sockaddr_storage a = {};
  socklen_t n = sizeof a;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return rc == 0 && AddressAndPort(a, addr, port);
}

ClientSocket ClientSocket::Find(const std::string& local_addr, int local_port,
                                const std::string& remote_addr, int remote_port) {
  ClientSocket s;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc/self/fd"), ::closedir);
  if (!dir || local_port <= 0 || remote_port <= 0) return s;
  while (const dirent* e = ::readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir.get())) continue;
    if (Matches(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      s.fd_ = static_cast<int>(fd);
      return s;
    }
  }
  return s;
}

bool ClientSocket::Closed() const {
  if (fd_ < 0) return false;
  pollfd p = {fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace k3::run
