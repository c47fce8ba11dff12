#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/models/collectives.hpp"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace stagehand {

class GlooProcess;

/// One tensor- or data-parallel group whose members are ranks in separate processes, over a Gloo
/// context of its own, connected (a full mesh, connect_gloo_mesh()) at the group's first
/// collective. The floats travel between the members directly; CAF carries only the rendezvous.
///
/// Reproducibility: a reduction is an all-gather of every member's whole buffer followed by a sum
/// in member order, bit-identical to HostGroup. Each rank receives (members - 1) x the buffer
/// instead of a ring all-reduce's 2 (members - 1) / members x: the same for groups of two, more for
/// larger groups; the reference model's reductions are small (logits, gradients of one shard).
///
/// Wire protocol: collective number `seq` sends every other member a head (the sender's region of
/// the buffer: offset and count; offset 0 in a reduction) followed by the floats, into slot 2 seq.
/// Gloo's TCP transport moves a message once the receiver has posted its receive, so each member
/// keeps the receive of its next collective posted (64 KiB per member, two alternating by
/// collective): one trip per collective. A larger message sends its head there and its floats in a
/// second transfer into slot 2 seq + 1.
///
/// Failures: every wait of a collective ends within the call limit. A member whose process died
/// fails the collective at once (its connection closes), a member that does not take part when the
/// limit passes; both errors name the member's rank. A failed collective leaves the members out of
/// step: it stops every collective of the process (GlooProcess::stop()) and resets this group's
/// connections, so that members still waiting on this one fail at once rather than at their limit.
/// A collective that has every member's data succeeds even when a member's connection closes
/// right after (its process ended): the next collective, or the goodbye, fails naming it.
///
/// Goodbye (ProcessCollectives::close()): each member sends every other member the number of
/// collectives it completed, into a slot of its own, and waits for theirs. A member says goodbye
/// only once its last collective has returned, so when a member holds every goodbye no member is
/// still reading one of its messages, and closing the connections resets no read. Nothing travels
/// after a goodbye, so the connections then close without a reset.
///
/// Thread-safety: each member's collectives from one thread at a time (Collective's contract);
/// start_farewell() then finish_farewell() from one other thread: a collective in flight on this
/// group (released by the stop) ends before the goodbye starts, and none runs until it finished.
class GlooGroup final : public Collective {
 public:
  using Clock = std::chrono::steady_clock;

  /// @param name the group's name, the same on every member ("data-parallel 0").
  /// @param ranks the members' ranks in member order; ranks[member] is this process's rank.
  GlooGroup(std::shared_ptr<GlooProcess> process, std::string name, std::vector<int> ranks,
            int member);
  ~GlooGroup() override;
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  // -- Collective --

  int size() const override { return static_cast<int>(ranks_.size()); }
  Status all_reduce_sum(int member, float* data, std::size_t count) override;
  Status all_gather(int member, float* full, std::size_t full_count, std::size_t offset,
                    std::size_t count) override;

  // -- goodbye (ProcessCollectives::close()) --

  /// Once no collective runs on this group, sends this member's goodbye to every other member and
  /// posts the receives of theirs.
  /// @pre the process is stopped (no collective starts any more).
  /// @returns true when finish_farewell() must follow; false when there is no one to say goodbye
  ///          to (never connected, one member, or out of step after a failed collective, whose
  ///          error said why); an error naming a member whose connection closed.
  Result<bool> start_farewell();
  /// Waits until `deadline` for every other member's goodbye, then closes the connections: cleanly
  /// when every goodbye came, with a reset otherwise.
  /// @pre start_farewell() returned true.
  /// @returns timeout naming the first member in member order that did not say goodbye in time
  ///          (and the limit); aborted naming one that died; internal when a member completed
  ///          another number of collectives.
  Status finish_farewell(Clock::time_point deadline);

  /// "data-parallel 0 group (ranks 0 2)".
  std::string describe() const;

 private:
  /// What a member sends first: its region of the buffer (offset 0 in a reduction).
  struct Head {
    std::uint64_t offset;
    std::uint64_t count;
  };
  enum class Link { unconnected, connected, closed };
  enum class Phase { collective, goodbye };

  static constexpr std::size_t kHeadFloats = sizeof(Head) / sizeof(float);
  /// The room of each receive posted ahead.
  static constexpr std::size_t kRoomFloats = 16384;
  /// Far above the slots of any collective.
  static constexpr std::uint64_t kFarewellSlot = std::uint64_t{1} << 63;

  static bool fits(std::uint64_t count) { return count <= kRoomFloats - kHeadFloats; }
  static std::uint64_t slot_of(std::uint64_t seq) { return 2 * seq; }

  /// Sends `mine` and its floats at `payload` to every other member, and leaves each other member
  /// m's head in heads_[m] and its floats at parts_[m] (valid until the next collective).
  /// @pre use_ is held.
  Status exchange(Head mine, const float* payload);
  /// Connects the context at the group's first collective (every member reaches it).
  Status connect();
  /// Posts the receive of collective `seq` from every other member; `current` names the member.
  void post_inbox(std::uint64_t seq, int& current);
  float* inbox_memory(std::size_t member, std::size_t parity);
  Status failure_with(int member, const std::string& what, Phase phase) const;
  /// Stops the process's collectives and resets this group's connections.
  void give_up(const Status& why);
  /// Lets go of the context and every transfer of it, resetting the connections first if `reset`.
  void disconnect(bool reset);

  const std::shared_ptr<GlooProcess> process_;
  const std::string name_;
  const std::vector<int> ranks_;
  const int member_;

  /// Held by a collective and by a goodbye from start to finish.
  std::mutex use_;
  std::unique_lock<std::mutex> farewell_lock_;

  Link link_ = Link::unconnected;
  std::shared_ptr<gloo::Context> context_;
  /// Collectives begun, and so (as none failed) completed.
  std::uint64_t seq_ = 0;
  /// A member whose connection closed after the last collective had all its data: the next
  /// collective fails with it (gloo's words in lost_what_).
  int lost_member_ = -1;
  std::string lost_what_;

  std::vector<Head> heads_;
  std::vector<const float*> parts_;
  /// Floats of messages too large for an inbox, by member.
  std::vector<std::vector<float>> large_;
  /// Two receives posted ahead per member (alternating by collective), over inbox_memory_.
  std::vector<std::array<std::unique_ptr<gloo::transport::UnboundBuffer>, 2>> inbox_;
  std::vector<float> inbox_memory_;
  std::vector<float> outbox_;
  std::vector<float> sum_;

  std::uint64_t farewell_out_ = 0;
  std::vector<std::uint64_t> farewell_in_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> farewell_sends_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> farewell_receives_;
};

}  // namespace stagehand
