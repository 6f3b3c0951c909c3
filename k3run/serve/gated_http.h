// cpp-httplib's request handling (routing, handlers, response writing and streaming) for a
// request the front door (front_door.h) has read whole: the worker runs it over a Stream that
// reads the request from memory and writes to the connection's socket. cpp-httplib's own
// listener is not used: its workers read the request themselves, so a slow client holds one.
#pragma once

#include <httplib.h>

#include "k3run/serve/front_door.h"

namespace k3::run {

class GatedHttpServer : public httplib::Server {
 public:
  // cpp-httplib ends a streamed response when its listening socket is gone (svr_sock_ invalid,
  // as stop() leaves it): the front door's socket stands for it while the server runs.
  explicit GatedHttpServer(int listen_fd) { svr_sock_ = listen_fd; }
  // Streams still being written end at their next chunk (as after httplib::Server::stop()).
  void EndStreams() { svr_sock_ = INVALID_SOCKET; }

  // Answers c's request (c->bytes[0, c->request_bytes)) on the calling thread and erases it
  // from c->bytes. A write that cannot proceed for `write_seconds` fails the response. True
  // when the connection may carry another request (keep-alive, and every write went out).
  bool Serve(GatedConnection* c, double write_seconds);
};

}  // namespace k3::run
