#pragma once

// The local tier's host folders when each host's disk is seen by its own processes only
// (trainer.local_replication_transport: network): each host's first rank serves its host's
// folder (actors/file_server.hpp), and every process reaches the other hosts' folders through
// their servers, found through rank 0's rendezvous store.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "stagehand/actors/file_server.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/routed_file_system.hpp"

namespace stagehand {

/// Routes over `local` in which the folder of every host but `own_host` (HostPlacement::disk)
/// waits for its server, at most `limit` per call: the file system under host_folders_file_system
/// before the world forms, so that nothing meant for another host's disk reaches this one's.
std::shared_ptr<RoutedFileSystem> host_routes(std::shared_ptr<FileSystem> local, const HostPlacement& placement,
                                              int own_host, std::chrono::milliseconds limit);

/// This process's part of the host servers, once the world formed: when `rank` is its host's
/// first, it serves the host's folder of `local` on this host's address towards `master_addr`
/// and publishes where ("stagehand/files/<host>") in the rendezvous store; then it connects to
/// every other host's server and sets its route in `routes`.
///
/// Every server is published before any is looked up, so processes never wait on each other in
/// a circle. Each lookup and connection ends within `limit`. On destruction, the sessions with
/// the other hosts' servers end (their routes fail from then on) and this process's server stops.
class HostServers {
 public:
  static Result<std::unique_ptr<HostServers>> start(caf::actor_system& system, const HostPlacement& placement, int rank,
                                                    std::shared_ptr<FileSystem> local,
                                                    std::shared_ptr<RoutedFileSystem> routes, caf::actor rendezvous,
                                                    const std::string& master_addr, std::chrono::milliseconds limit);
  ~HostServers();
  HostServers(const HostServers&) = delete;
  HostServers& operator=(const HostServers&) = delete;

  /// The server of this process, when it serves its host's folder (no actor otherwise).
  const FileServer& server() const { return server_; }

 private:
  HostServers(caf::actor_system& system, HostPlacement placement, int own_host, std::shared_ptr<RoutedFileSystem> routes)
      : system_(system), placement_(std::move(placement)), own_host_(own_host), routes_(std::move(routes)) {}
  caf::actor_system& system_;
  HostPlacement placement_;
  int own_host_;
  std::shared_ptr<RoutedFileSystem> routes_;
  FileServer server_;
};

}  // namespace stagehand
