#pragma once

// A host's folder served to the processes of other hosts, for disks that only their own host can
// see (trainer.local_replication_transport: network): the local tier's replicas, metadata and
// tracker written into another host's folder, and read back from it by a resume's check, go
// through the storage interface to that host's file server over CAF's middleman (TCP).

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// A published file server: its actor and the TCP port it listens on.
struct FileServer {
  caf::actor actor;
  std::uint16_t port = 0;
};

/// Serves the paths at or below `folder` (absolute, no "..") of `local` to remote file systems
/// (remote_file_system), on a TCP port of `address` that the system picks. Paths elsewhere are
/// refused (permission_denied), as are calls without a path and reads of more than
/// kRemoteChunkBytes at once; the server follows symbolic links inside the folder as the local
/// file system does (the folder is trusted). Files opened and locks taken for a client are kept
/// until it closes or releases them, or until its remote file system or process goes away (a
/// write never synced is then lost, as in a crash); a client reaches only its own. An exception
/// in a call is that call's error, not the server's end.
///
/// Requests are served one at a time on a thread of their own: every call blocks on the disk.
/// @returns io_error when the port cannot be opened.
Result<FileServer> serve_folder(caf::actor_system& system, std::shared_ptr<FileSystem> local, std::string folder,
                                const std::string& address);

/// Closes the server's port and stops it.
void stop_file_server(caf::actor_system& system, const FileServer& server);

/// A FileSystem whose every call is answered by the file server `server` (connected with
/// connect_remote_actor): bytes travel in messages of at most kRemoteChunkBytes. `name` says
/// whose server it is in errors ("host 1's file server at 10.0.0.2:41234"). Every call waits at
/// most `limit`; one that gets no answer fails with timeout, and one whose server is gone with
/// io_error, naming the server, the call and the path; a read or write of many messages has one
/// limit for all of them. What a call that timed out opened on the server is released there.
/// Files and locks opened through it are released on the server when it is destroyed.
/// Capabilities are those of a local disk.
/// Thread-safety: every member may be called from any thread.
std::shared_ptr<FileSystem> remote_file_system(caf::actor_system& system, caf::actor server, std::string name,
                                               std::chrono::milliseconds limit);

/// The most bytes one message of a remote file system carries.
inline constexpr std::size_t kRemoteChunkBytes = 8u << 20;

}  // namespace stagehand
