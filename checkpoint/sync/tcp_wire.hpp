#pragma once

// The TCP weight-sync channel's wire (the internals of tcp_publisher.cpp and tcp_receiver.cpp):
// addresses, non-blocking sockets waited on with poll() and a deadline, frames
// ([u32 type][u32 length][payload]) and their payloads, the byte ranges a receiver is sent.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/checkpoint/sync/channel_wire.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand::tcp_detail {

using namespace sync_detail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint64_t kMagic = 0x3150435453574853ull;  // "SHWSTCP1"
constexpr std::uint32_t kMaxFrame = 256u << 20;

enum Msg : std::uint32_t {
  kPeer = 1,         // rank r -> rank 0: {magic, rank, world, port, n, descriptors}
  kDirectory = 2,    // rank 0 -> a rank or a receiver: {world, per rank: host, port, n, descriptors}
  kDirRequest = 3,   // receiver -> rank 0: {magic}
  kHello = 4,        // receiver -> rank r: {magic, pid, name, host, n, descriptors}
  kHelloOk = 5,      // rank r -> receiver: {}
  kError = 6,        // either way: {message}
  kWant = 7,         // receiver -> rank r: {min_step}: it waits for a version
  kIdle = 8,         // receiver -> rank r: it waits no longer
  kIdleAck = 9,      // rank r -> receiver: after any version under way
  kVersion = 10,     // rank r -> receiver: {version, step, bytes}, then `bytes` of payload
  kGot = 11,         // receiver -> rank r: {version}: all of it is in its tensors
  kStatus = 12,      // anyone -> rank r: {magic}
  kStatusReply = 13  // rank r -> anyone: {done_step}
};

struct Endpoint {
  std::string host;
  int port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

inline Result<Endpoint> parse_endpoint(const std::string& address) {
  const auto colon = address.rfind(':');
  Endpoint e;
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return invalid("TCP address '" + address + "' is not HOST:PORT");
  }
  e.host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return invalid("TCP address '" + address + "' has no port in [1, 65535]");
  }
  e.port = std::stoi(port);
  return e;
}

inline Result<sockaddr_in> resolve(const Endpoint& e) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(e.host.c_str(), std::to_string(e.port).c_str(), &hints, &found);
  if (rc != 0 || !found) {
    return Status{ErrorCode::invalid_argument, "weight sync: cannot resolve host '" + e.host + "': " + gai_strerror(rc)};
  }
  sockaddr_in out = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  return out;
}

inline void set_socket_options(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline std::string peer_host(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  char buf[INET_ADDRSTRLEN] = {};
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return buf;
}

/// A listening socket on `e` (port 0: one the system picks); sets `*port` to the port bound.
inline Result<int> listen_on(const Endpoint& e, int* port) {
  auto addr = resolve(e);
  if (!addr.is_ok()) return addr.status();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status{ErrorCode::io_error, std::string("weight sync: socket: ") + std::strerror(errno)};
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) != 0 || ::listen(fd, 256) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status{ErrorCode::io_error, "weight sync: cannot listen on " + e.to_string() + ": " + why};
  }
  sockaddr_in bound{};
  socklen_t n = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &n);
  *port = ntohs(bound.sin_port);
  set_socket_options(fd);
  return fd;
}

/// Waits until `fd` is ready for `events` (or `stop_fd` is readable) until `deadline`.
/// Returns 1 ready, 0 timed out, -1 stopped.
inline int wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd) {
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(p, stop_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left + 1, 1000)));
    if (n < 0 && errno != EINTR) return 0;
    if (stop_fd >= 0 && (p[1].revents & POLLIN)) return -1;
    if (n > 0 && p[0].revents != 0) return 1;
  }
}

/// Connects to `e` by `deadline`; with `retry`, trying again while nothing listens there. A
/// readable `stop_fd` ends it (aborted).
inline Result<int> connect_to(const Endpoint& e, Clock::time_point deadline, const std::string& who, bool retry = true,
                              int stop_fd = -1) {
  auto addr = resolve(e);
  if (!addr.is_ok()) return addr.status();
  std::string last = "nothing listens there";
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return Status{ErrorCode::io_error, std::string("weight sync: socket: ") + std::strerror(errno)};
    set_socket_options(fd);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr);
    if (rc != 0 && errno == EINPROGRESS) {
      const int ready = wait_fd(fd, POLLOUT, deadline, stop_fd);
      if (ready < 0) {
        ::close(fd);
        return Status{ErrorCode::aborted, "weight sync: stopped"};
      }
      if (ready == 1) {
        int err = 0;
        socklen_t n = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) return fd;
    last = std::strerror(errno);
    ::close(fd);
    if (!retry || Clock::now() >= deadline) {
      return Status{retry ? ErrorCode::timeout : ErrorCode::io_error,
                    "weight sync: " + who + " at " + e.to_string() + " cannot be reached: " + last};
    }
    if (wait_fd(stop_fd, POLLIN, std::min(deadline, Clock::now() + milliseconds(20)), -1) == 1) {
      return Status{ErrorCode::aborted, "weight sync: stopped"};
    }
  }
}

/// Writes all of `data`; false on a broken connection, a timeout or a stop.
inline Status write_all(int fd, const void* data, std::size_t n, Clock::time_point deadline, const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (wait_fd(fd, POLLOUT, deadline, -1) != 1) return {ErrorCode::timeout, "weight sync: writing to " + who + " timed out"};
      continue;
    }
    return {ErrorCode::io_error, "weight sync: the connection to " + who + " broke: " + std::strerror(errno)};
  }
  return Status::ok();
}

/// Reads exactly `n` bytes. Errors: timeout, aborted (stopped), io_error (closed or broken).
inline Status read_all(int fd, void* data, std::size_t n, Clock::time_point deadline, int stop_fd,
                       const std::string& who) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return {ErrorCode::io_error, "weight sync: " + who + " closed the connection"};
    if (errno == EAGAIN || errno == EINTR) {
      const int ready = wait_fd(fd, POLLIN, deadline, stop_fd);
      if (ready == 0) return {ErrorCode::timeout, "weight sync: reading from " + who + " timed out"};
      if (ready < 0) return {ErrorCode::aborted, "weight sync: stopped"};
      continue;
    }
    return {ErrorCode::io_error, "weight sync: the connection to " + who + " broke: " + std::strerror(errno)};
  }
  return Status::ok();
}

// ---- Frames and payloads.

struct Writer {
  std::string out;
  template <class T>
  Writer& pod(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(const std::string& s) {
    pod(static_cast<std::uint32_t>(s.size()));
    out += s;
    return *this;
  }
  Writer& descs(const std::vector<ShardedTensorDesc>& d) {
    pod(static_cast<std::uint32_t>(d.size()));
    return str(encode(d));
  }
};

struct Reader {
  Decoder in;
  explicit Reader(const std::string& s) : in{s.data(), s.data() + s.size()} {}
  template <class T>
  T pod() {
    T v{};
    in.get(&v, sizeof v);
    return v;
  }
  std::string str() {
    const auto n = pod<std::uint32_t>();
    std::string s;
    if (!in.ok || n > static_cast<std::size_t>(in.end - in.p)) {
      in.ok = false;
      return s;
    }
    s.assign(in.p, n);
    in.p += n;
    return s;
  }
  Result<std::vector<ShardedTensorDesc>> descs() {
    const auto n = pod<std::uint32_t>();
    const std::string bytes = str();
    if (!in.ok) return Status{ErrorCode::corruption, "weight sync: a damaged message"};
    return decode(bytes.data(), bytes.size(), n);
  }
  bool ok() const { return in.ok; }
};

inline std::string frame(Msg type, const std::string& payload = {}) {
  Writer w;
  w.pod(static_cast<std::uint32_t>(type)).pod(static_cast<std::uint32_t>(payload.size()));
  w.out += payload;
  return std::move(w.out);
}

struct Frame {
  Msg type{};
  std::string payload;
};

inline Result<Frame> read_frame(int fd, Clock::time_point deadline, int stop_fd, const std::string& who) {
  std::uint32_t head[2] = {};
  SH_RETURN_IF_ERROR(read_all(fd, head, sizeof head, deadline, stop_fd, who));
  if (head[1] > kMaxFrame) return Status{ErrorCode::corruption, "weight sync: " + who + " sent a frame of " + std::to_string(head[1]) + " bytes"};
  Frame f;
  f.type = static_cast<Msg>(head[0]);
  f.payload.resize(head[1]);
  SH_RETURN_IF_ERROR(read_all(fd, f.payload.data(), f.payload.size(), deadline, stop_fd, who));
  if (f.type == kError) {
    Reader r(f.payload);
    return Status{ErrorCode::invalid_argument, r.str()};
  }
  return f;
}

// ---- What a receiver is sent.

/// One byte range of a trainer rank's sent block that a receiver's block overlaps: the elements
/// [first, end) of the sent block (row-major), the smallest range holding the overlap; with
/// `direct`, all of them are the overlap and land in one run of the receiver's block from that
/// element on.
struct Span {
  std::uint32_t tensor;  // the sender's tensor (index into its blocks)
  std::uint32_t block;   // the receiver's block
  std::int64_t first = 0, end = 0;
  std::optional<std::int64_t> direct;
  std::uint64_t bytes(std::size_t elem) const { return static_cast<std::uint64_t>(end - first) * elem; }
};

inline Span span_of(const ShardedTensorDesc& from, std::uint32_t tensor, const ShardedTensorDesc& to,
                    std::uint32_t block) {
  ChunkMeta overlap;
  std::vector<std::int64_t> lo(from.local_shape.rank()), shape(from.local_shape.rank());
  for (std::size_t i = 0; i < lo.size(); ++i) {
    lo[i] = std::max(from.global_offset[i], to.global_offset[i]);
    shape[i] = std::min(from.global_offset[i] + from.local_shape[i], to.global_offset[i] + to.local_shape[i]) - lo[i];
  }
  overlap.offsets = Shape(lo);
  overlap.shape = Shape(shape);
  const Shape strides = row_major_strides(from.local_shape);
  std::int64_t first = 0, last = 0;
  for (std::size_t i = 0; i < lo.size(); ++i) {
    first += (lo[i] - from.global_offset[i]) * strides[i];
    last += (lo[i] + shape[i] - 1 - from.global_offset[i]) * strides[i];
  }
  Span s{tensor, block, first, last + 1, std::nullopt};
  if (contiguous_offset(overlap, from)) s.direct = contiguous_offset(overlap, to);
  return s;
}

/// The spans trainer rank (blocks `descs`, sending `sent`) streams to a receiver of `blocks`, in order.
inline std::vector<Span> spans_of(const std::vector<ShardedTensorDesc>& descs, const std::vector<std::uint32_t>& sent,
                                  const std::vector<Part>& parts, const std::vector<ShardedTensorDesc>& blocks) {
  std::vector<Span> out;
  for (const Part& p : parts) {
    out.push_back(span_of(descs[sent[p.sent_index]], sent[p.sent_index], blocks[p.block], p.block));
  }
  return out;
}

/// A file descriptor closed with its owner.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

}  // namespace stagehand::tcp_detail
