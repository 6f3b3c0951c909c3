// Whether the HTTP client of a request is still connected, for a handler that holds no socket:
// cpp-httplib 0.11 hands a handler only its connection's addresses and ports. A non-streamed
// completion writes nothing until it is done, so without this a client that gave up would keep
// its slot until the last token. The connection's socket is found among this process's open
// sockets by those addresses and ports; POLLRDHUP on it means the client closed its end.
// Linux only (/proc/self/fd, POLLRDHUP), as k3 is.
#pragma once

#include <string>

namespace k3::run {

// The address ("a.b.c.d", or the IPv6 text form) and port of socket fd's own end (peer false)
// or of its peer, as cpp-httplib writes them into a Request; false for other families.
bool SocketAddress(int fd, bool peer, std::string* addr, int* port);

class ClientSocket {
 public:
  // The connected socket whose local end is local_addr:local_port and whose peer is
  // remote_addr:remote_port (as cpp-httplib's Request gives them); found() is false when no
  // socket matches (then Closed() is always false).
  static ClientSocket Find(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  // True when the client closed its end or the connection broke. Never blocks, never reads.
  // The socket stays the request's while its handler runs (cpp-httplib closes it after), so
  // the descriptor cannot be reused under us.
  bool Closed() const;

 private:
  int fd_ = -1;
};

}  // namespace k3::run
