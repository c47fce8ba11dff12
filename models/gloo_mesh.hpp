#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"

namespace gloo {
class Context;
}  // namespace gloo

namespace stagehand {

class GlooProcess;

/// Connects the Gloo context of one group as a full mesh, through rank 0's rendezvous store: each
/// member publishes the addresses of its pairs under "<key>/<member>", reads every other member's,
/// and then connects to each. Every member calls it with the same key and ranks.
///
/// Limits: reading the addresses ends by `deadline` as a whole, and each connection after that
/// waits at most what was left of the limit when the pairs were made (Gloo's own connect limit is
/// five times a pair's timeout, which is set to a fifth of that). An error names the member's
/// rank and says which limit passed.
///
/// @param ranks the members' ranks in member order; ranks[member] is this process's rank.
/// @pre ranks.size() > 1
/// @returns the connected context; timeout naming the rank that did not publish or connect in
///          time; aborted when the process stopped, when rank 0's store cannot be reached, or when
///          a member's process is gone; io_error when Gloo cannot open its sockets.
/// Thread-safety: any thread; it blocks until connected or failed.
Result<std::shared_ptr<gloo::Context>> connect_gloo_mesh(
    GlooProcess& process, const std::string& key, const std::vector<int>& ranks, int member,
    std::chrono::steady_clock::time_point deadline);

}  // namespace stagehand
