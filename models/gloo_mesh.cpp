#include "stagehand/models/gloo_mesh.hpp"

#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <cstddef>
#include <exception>

#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/rendezvous.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

// Gloo's rendezvous::Context::connectFullMesh gives every key and every connection a limit of
// its own (a connection five times over) and its errors name a store key or a socket address,
// not a rank; this context is connected here instead, through the context's protected members.
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int member, int members) : gloo::Context(member, members) {}

  void attach(std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> transport) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

}  // namespace

Result<std::shared_ptr<gloo::Context>> connect_gloo_mesh(GlooProcess& process,
                                                         const std::string& key,
                                                         const std::vector<int>& ranks, int member,
                                                         Clock::time_point deadline) {
  const int size = static_cast<int>(ranks.size());
  if (size < 2)
    return Status{ErrorCode::internal, "a Gloo mesh of " + std::to_string(size) + " member"};
  auto rank_of = [&](int m) {
    return "rank " + std::to_string(ranks[static_cast<std::size_t>(m)]);
  };
  auto announced = process.await_rendezvous(deadline);
  if (!announced.is_ok()) return announced.status().with_context(rank_of(member));
  RendezvousClient rendezvous(process.system(), std::move(*announced));
  SH_ASSIGN_OR_RETURN(auto device, process.device());
  auto context = std::make_shared<MeshContext>(member, size);
  context->setTimeout(process.limit());
  int current = member;  // whose address or connection is awaited
  try {
    auto transport = device->createContext(member, size);
    // A pair waits up to five times its timeout for its connection: a fifth of what is left keeps
    // each connection within the limit (and zero would be no limit at all).
    transport->setTimeout(std::max(std::chrono::milliseconds(1), left_until(deadline) / 5));
    std::string addresses;  // of this member's pairs, in member order
    for (int m = 0; m < size; ++m) {
      if (m == member) continue;
      auto bytes = transport->createPair(m)->address().bytes();
      addresses.append(bytes.begin(), bytes.end());
    }
    const std::size_t address_size = addresses.size() / static_cast<std::size_t>(size - 1);
    if (auto st = rendezvous.set(key + "/" + std::to_string(member), addresses, deadline);
        !st.is_ok()) {
      if (st.code() != ErrorCode::timeout) return st;
      return Status{ErrorCode::timeout, "rank 0's rendezvous did not take " + rank_of(member) +
                                            "'s address within " + process.limit_text("connect")};
    }
    // Every address first: a member that published one is listening on it, so once all are known
    // the connections follow at once.
    std::vector<std::string> published(static_cast<std::size_t>(size));
    for (current = 0; current < size; ++current) {
      if (current == member) continue;
      auto value = rendezvous.get(key + "/" + std::to_string(current), deadline);
      if (!value.is_ok()) {
        if (value.status().code() != ErrorCode::timeout) return value.status();
        return Status{ErrorCode::timeout, rank_of(current) +
                                              " did not publish its address at rank 0 within " +
                                              process.limit_text("connect")};
      }
      if (value->size() != addresses.size()) {
        return Status{ErrorCode::internal,
                      rank_of(current) + " published " + std::to_string(value->size()) +
                          " bytes of addresses, not " + std::to_string(addresses.size())};
      }
      published[static_cast<std::size_t>(current)] = std::move(*value);
    }
    for (current = 0; current < size; ++current) {
      if (current == member) continue;
      // Member `current` lists its pairs in member order without itself.
      const std::size_t index = static_cast<std::size_t>(member < current ? member : member - 1);
      const std::string& theirs = published[static_cast<std::size_t>(current)];
      transport->getPair(current)->connect(std::vector<char>(
          theirs.begin() + static_cast<std::ptrdiff_t>(index * address_size),
          theirs.begin() + static_cast<std::ptrdiff_t>((index + 1) * address_size)));
    }
    context->attach(std::move(device), std::move(transport));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (current == member) return Status{ErrorCode::io_error, "gloo: " + what};
    if (what.find("Connect timeout") != std::string::npos) {
      return Status{ErrorCode::timeout, rank_of(current) + " did not connect within " +
                                            process.limit_text("connect") + " (gloo: " + what +
                                            ")"};
    }
    return Status{ErrorCode::aborted,
                  "connecting to " + rank_of(current) +
                      " failed: its process is gone or unreachable (gloo: " + what + ")"};
  }
  return std::shared_ptr<gloo::Context>(std::move(context));
}

}  // namespace stagehand
