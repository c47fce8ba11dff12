#include "stagehand/models/gloo_process.hpp"

#include <arpa/inet.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>

namespace stagehand {

std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &found) != 0 || found == nullptr)
    return master_addr;
  std::string out = master_addr;
  int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  char text[INET6_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    const void* addr =
        local.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

namespace {

std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

}  // namespace

GlooProcess::GlooProcess(caf::actor_system& system, std::string master_addr,
                         std::chrono::milliseconds limit, std::string limit_setting)
    : system_(system),
      master_addr_(std::move(master_addr)),
      limit_(limit),
      limit_setting_(std::move(limit_setting)) {}

std::string GlooProcess::limit_text(const std::string& which) const {
  return "the " + which + " limit of " + duration_text(limit_) +
         (limit_setting_.empty() ? "" : " (" + limit_setting_ + ")");
}

void GlooProcess::set_rendezvous(caf::actor store) {
  std::lock_guard<std::mutex> lock(mutex_);
  store_ = std::move(store);
  announced_.notify_all();
}

Result<caf::actor> GlooProcess::await_rendezvous(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  announced_.wait_until(lock, deadline, [&] { return stopped_.has_value() || store_; });
  if (stopped_) return Status{ErrorCode::aborted, "collectives stopped: " + *stopped_};
  if (!store_) {
    return Status{ErrorCode::timeout,
                  "rank 0's rendezvous was not announced within " + limit_text("connect")};
  }
  return store_;
}

Result<std::shared_ptr<gloo::transport::Device>> GlooProcess::device() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_) return device_;
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else {
    attr.hostname = local_address_towards(master_addr_);
  }
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return Status{ErrorCode::io_error, std::string("opening the Gloo device: ") + e.what()};
  }
  return device_;
}

void GlooProcess::stop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stopped_) stopped_ = reason;
  for (auto* transfer : tracked_) {
    transfer->abortWaitRecv();
    transfer->abortWaitSend();
  }
  announced_.notify_all();
}

std::optional<std::string> GlooProcess::stopped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopped_;
}

Status GlooProcess::stopped_status() const {
  return {ErrorCode::aborted, "collectives stopped: " + stopped().value_or("aborted")};
}

bool GlooProcess::track(gloo::transport::UnboundBuffer* transfer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) return false;
  tracked_.insert(transfer);
  return true;
}

void GlooProcess::untrack(gloo::transport::UnboundBuffer* transfer) {
  std::lock_guard<std::mutex> lock(mutex_);
  tracked_.erase(transfer);
}

}  // namespace stagehand
