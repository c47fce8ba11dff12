#include "stagehand/models/host_servers.hpp"

#include <caf/all.hpp>

#include <charconv>

#include "stagehand/actors/process_world.hpp"
#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/rendezvous.hpp"

namespace stagehand {

namespace {

std::string key_of(int host) { return "stagehand/files/" + std::to_string(host); }

std::string host_text(int host) { return "host " + std::to_string(host) + "'s"; }

}  // namespace

std::shared_ptr<RoutedFileSystem> host_routes(std::shared_ptr<FileSystem> local, const HostPlacement& placement,
                                              int own_host, std::chrono::milliseconds limit) {
  auto routes = RoutedFileSystem::create(std::move(local), limit);
  for (int h = 0; h < placement.hosts; ++h) {
    if (h == own_host) continue;
    routes->expect_route(placement.disk(h), host_text(h) + " folder '" + placement.disk(h) + "' (its file server)");
  }
  return routes;
}

Result<std::unique_ptr<HostServers>> HostServers::start(caf::actor_system& system, const HostPlacement& placement,
                                                         int rank, std::shared_ptr<FileSystem> local,
                                                         std::shared_ptr<RoutedFileSystem> routes, caf::actor rendezvous,
                                                         const std::string& master_addr,
                                                         std::chrono::milliseconds limit) {
  const int own = placement.host_of(rank);
  std::unique_ptr<HostServers> out(new HostServers(system, placement, own, routes));
  RendezvousClient store(system, std::move(rendezvous));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  if (rank % placement.ranks_per_host == 0) {
    const std::string address = local_address_towards(master_addr);
    SH_ASSIGN_OR_RETURN(out->server_, serve_folder(system, std::move(local), placement.disk(own), address));
    Status published = store.set(key_of(own), address + ":" + std::to_string(out->server_.port), deadline);
    if (!published.is_ok()) return published.with_context("publishing " + host_text(own) + " file server");
  }
  for (int h = 0; h < placement.hosts; ++h) {
    if (h == own) continue;
    const std::string what = host_text(h) + " file server";
    auto where = store.get(key_of(h), deadline);
    if (!where.is_ok()) {
      Status st = where.status().with_context("finding " + what + " (rank " + std::to_string(h * placement.ranks_per_host) +
                                              " serves it)");
      routes->fail_route(placement.disk(h), st);
      return st;
    }
    const std::size_t colon = where->rfind(':');
    unsigned port = 0;
    const char* end = where->data() + where->size();
    if (colon == std::string::npos || std::from_chars(where->data() + colon + 1, end, port).ptr != end || port == 0 ||
        port > 65535) {
      Status st{ErrorCode::invalid_argument, what + " was published as '" + *where + "', not host:port"};
      routes->fail_route(placement.disk(h), st);
      return st;
    }
    const std::string host = where->substr(0, colon);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto actor = connect_remote_actor(system, host, static_cast<std::uint16_t>(port), std::max(left, std::chrono::milliseconds(1)));
    if (!actor.is_ok()) {
      Status st = actor.status().with_context("connecting to " + what + " at " + *where);
      routes->fail_route(placement.disk(h), st);
      return st;
    }
    routes->set_route(placement.disk(h), remote_file_system(system, *actor, what + " at " + *where, limit));
  }
  return out;
}

HostServers::~HostServers() {
  for (int h = 0; h < placement_.hosts; ++h) {
    if (h == own_host_) continue;
    // Drops the remote file system: its session with that host's server ends.
    routes_->fail_route(placement_.disk(h), Status{ErrorCode::aborted, host_text(h) + " folder: this process is done"});
  }
  stop_file_server(system_, server_);
}

}  // namespace stagehand
