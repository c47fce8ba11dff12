#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
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
/// step: it stops every collective of the process (GlooProcess::stop()) and closes this group's
/// connections, so that members still waiting on this one fail at once rather than at their limit.
///
/// Thread-safety: each member's collectives from one thread at a time (Collective's contract).
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

  /// "data-parallel 0 group (ranks 0 2)".
  std::string describe() const;

 private:
  /// What a member sends first: its region of the buffer (offset 0 in a reduction).
  struct Head {
    std::uint64_t offset;
    std::uint64_t count;
  };

  static constexpr std::size_t kHeadFloats = sizeof(Head) / sizeof(float);
  /// The room of each receive posted ahead.
  static constexpr std::size_t kRoomFloats = 16384;

  static bool fits(std::uint64_t count) { return count <= kRoomFloats - kHeadFloats; }
  static std::uint64_t slot_of(std::uint64_t seq) { return 2 * seq; }

  /// Sends `mine` and its floats at `payload` to every other member, and leaves each other member
  /// m's head in heads_[m] and its floats at parts_[m] (valid until the next collective).
  Status exchange(Head mine, const float* payload);
  /// Connects the context at the group's first collective (every member reaches it).
  Status connect();
  /// Posts the receive of collective `seq` from every other member; `current` names the member.
  void post_inbox(std::uint64_t seq, int& current);
  float* inbox_memory(std::size_t member, std::size_t parity);
  Status failure_with(int member, const std::string& what) const;
  /// Stops the process's collectives and closes this group's connections.
  void give_up(const Status& why);

  const std::shared_ptr<GlooProcess> process_;
  const std::string name_;
  const std::vector<int> ranks_;
  const int member_;

  std::shared_ptr<gloo::Context> context_;
  std::uint64_t seq_ = 0;

  std::vector<Head> heads_;
  std::vector<const float*> parts_;
  /// Floats of messages too large for an inbox, by member.
  std::vector<std::vector<float>> large_;
  /// Two receives posted ahead per member (alternating by collective), over inbox_memory_.
  std::vector<std::array<std::unique_ptr<gloo::transport::UnboundBuffer>, 2>> inbox_;
  std::vector<float> inbox_memory_;
  std::vector<float> outbox_;
  std::vector<float> sum_;
};

}  // namespace stagehand
