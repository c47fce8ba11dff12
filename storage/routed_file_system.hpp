#pragma once

// Folders served by other file systems than the local one: the local tier's folders of other
// hosts, reached through their hosts' file servers (actors/file_server.hpp) when each host's disk
// is visible to its own processes only.

#include <chrono>
#include <memory>
#include <string>

#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// A FileSystem that sends every path at or below a routed folder to that folder's file system,
/// and every other path to `local`.
///
/// A folder may be routed before its file system exists (expect_route()): calls on paths there
/// wait until set_route() or fail_route() is called for it, at most the limit given at creation,
/// so that a call made before a remote host's server is connected neither reaches the local disk
/// nor waits without a limit. A rename or exchange between two routes is invalid_argument.
///
/// Thread-safety: every member may be called from any thread.
class RoutedFileSystem : public FileSystem {
 public:
  /// The routes of folders; `local` serves every path outside them.
  static std::shared_ptr<RoutedFileSystem> create(std::shared_ptr<FileSystem> local, std::chrono::milliseconds wait_limit);

  /// Paths at or below `folder` wait for its route; `what` names it in errors ("host 1's folder").
  virtual void expect_route(const std::string& folder, const std::string& what) = 0;
  /// Paths at or below `folder` go to `fs` from now on; wakes the calls waiting for it.
  virtual void set_route(const std::string& folder, std::shared_ptr<FileSystem> fs) = 0;
  /// Calls on paths at or below `folder` fail with `why` from now on (its server could not be
  /// reached); wakes the calls waiting for it.
  virtual void fail_route(const std::string& folder, Status why) = 0;
};

}  // namespace stagehand
