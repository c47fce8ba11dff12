#include "stagehand/models/process_collectives.hpp"

#include <caf/all.hpp>

#include <algorithm>

#include "stagehand/actors/messages.hpp"

namespace stagehand {

namespace {


/// Receives other ranks' collective contributions into the inbox.
caf::behavior collective_endpoint(caf::event_based_actor*, std::shared_ptr<CollectiveInbox> inbox) {
  return {
      [inbox](collective_atom, std::int32_t group, std::int64_t seq, std::int32_t from, std::uint64_t offset,
              std::vector<float>& data) {
        inbox->deliver({group, seq, from}, {offset, std::move(data)});
      },
  };
}

}  // namespace

// -- CollectiveInbox --

void CollectiveInbox::deliver(Key key, Part part) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parts_[key] = std::move(part);
  }
  arrived_.notify_all();
}

Result<std::map<std::int32_t, CollectiveInbox::Part>> CollectiveInbox::take(std::int32_t group, std::int64_t seq,
                                                                             const std::vector<int>& senders,
                                                                             std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_there = [&] {
    return std::all_of(senders.begin(), senders.end(),
                       [&](int s) { return parts_.count({group, seq, static_cast<std::int32_t>(s)}) != 0; });
  };
  bool ready = arrived_.wait_for(lock, timeout, [&] { return closed_.has_value() || all_there(); });
  if (closed_) return Status{ErrorCode::aborted, "collective stopped: " + *closed_};
  if (!ready) {
    std::string missing;
    for (int s : senders) {
      if (parts_.count({group, seq, static_cast<std::int32_t>(s)}) == 0) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(s);
      }
    }
    return Status{ErrorCode::timeout, "collective of group " + std::to_string(group) + ": no contribution from rank(s) " +
                                          missing + " within " + std::to_string(timeout.count() / 1000) + " s"};
  }
  std::map<std::int32_t, Part> out;
  for (int s : senders) {
    auto it = parts_.find({group, seq, static_cast<std::int32_t>(s)});
    out[static_cast<std::int32_t>(s)] = std::move(it->second);
    parts_.erase(it);
  }
  return out;
}

void CollectiveInbox::set_peers(std::vector<caf::actor> endpoints) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_ = std::move(endpoints);
  }
  arrived_.notify_all();
}

Result<std::vector<caf::actor>> CollectiveInbox::peers(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  arrived_.wait_for(lock, timeout, [&] { return closed_.has_value() || peers_.has_value(); });
  if (closed_) return Status{ErrorCode::aborted, "collective stopped: " + *closed_};
  if (!peers_) return Status{ErrorCode::timeout, "the other ranks' endpoints did not arrive in time"};
  return *peers_;
}

void CollectiveInbox::close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) closed_ = reason;
  }
  arrived_.notify_all();
}

// -- ProcessCollectives --

/// One group whose members (ranks, in member order) are in other processes.
class ProcessCollectives::Group final : public Collective {
 public:
  Group(std::int32_t id, std::vector<int> ranks, int own_rank, std::shared_ptr<CollectiveInbox> inbox,
        std::chrono::milliseconds timeout)
      : id_(id), ranks_(std::move(ranks)), own_rank_(own_rank), inbox_(std::move(inbox)), timeout_(timeout) {
    for (int r : ranks_) {
      if (r != own_rank_) others_.push_back(r);
    }
  }

  int size() const override { return static_cast<int>(ranks_.size()); }

  Status all_reduce_sum(int member, float* data, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    SH_ASSIGN_OR_RETURN(auto parts, exchange(std::vector<float>(data, data + count), 0));
    std::vector<float> sum(count, 0.0f);
    for (std::size_t m = 0; m < ranks_.size(); ++m) {
      const float* contribution = static_cast<int>(m) == member ? data : parts[ranks_[m]].data.data();
      if (static_cast<int>(m) != member && parts[ranks_[m]].data.size() != count) {
        return Status{ErrorCode::internal, "collective of group " + std::to_string(id_) + ": rank " +
                                               std::to_string(ranks_[m]) + " sent a different length"};
      }
      for (std::size_t i = 0; i < count; ++i) sum[i] += contribution[i];
    }
    std::copy(sum.begin(), sum.end(), data);
    return Status::ok();
  }

  Status all_gather(int, float* full, std::size_t offset, std::size_t count) override {
    if (ranks_.size() == 1) return Status::ok();
    SH_ASSIGN_OR_RETURN(auto parts, exchange(std::vector<float>(full + offset, full + offset + count), offset));
    for (auto& [rank, part] : parts) std::copy(part.data.begin(), part.data.end(), full + part.offset);
    return Status::ok();
  }

 private:
  Result<std::map<std::int32_t, CollectiveInbox::Part>> exchange(const std::vector<float>& mine, std::uint64_t offset) {
    const std::int64_t seq = ++seq_;
    if (peers_.empty()) {
      // Set once per world: fetched at the first collective, then kept.
      SH_ASSIGN_OR_RETURN(peers_, inbox_->peers(timeout_));
    }
    for (int r : others_) {
      if (static_cast<std::size_t>(r) >= peers_.size() || !peers_[static_cast<std::size_t>(r)]) {
        return Status{ErrorCode::internal, "no collective endpoint for rank " + std::to_string(r)};
      }
      caf::anon_send(peers_[static_cast<std::size_t>(r)], collective_atom::value, id_, seq,
                     static_cast<std::int32_t>(own_rank_), offset, mine);
    }
    return inbox_->take(id_, seq, others_, timeout_);
  }

  std::int32_t id_;
  std::vector<int> ranks_;
  int own_rank_;
  std::vector<int> others_;
  std::shared_ptr<CollectiveInbox> inbox_;
  std::chrono::milliseconds timeout_;
  std::vector<caf::actor> peers_;
  std::int64_t seq_ = 0;
};

ProcessCollectives::ProcessCollectives(caf::actor_system& system, std::chrono::milliseconds timeout)
    : system_(system),
      timeout_(timeout),
      inbox_(std::make_shared<CollectiveInbox>()),
      endpoint_(system.spawn(collective_endpoint, inbox_)) {}

ProcessCollectives::~ProcessCollectives() {
  close("shutting down");
  caf::anon_send_exit(endpoint_, caf::exit_reason::user_shutdown);
}

void ProcessCollectives::set_peers(std::vector<caf::actor> endpoints) { inbox_->set_peers(std::move(endpoints)); }

void ProcessCollectives::close(const std::string& reason) { inbox_->close(reason); }

RankGroups ProcessCollectives::groups(const ParallelLayout& layout, int rank) {
  const int tp = layout.tensor_parallel;
  const int dp = layout.data_parallel;
  std::vector<int> tensor_ranks;
  for (int t = 0; t < tp; ++t) tensor_ranks.push_back(layout.data_index(rank) * tp + t);
  std::vector<int> data_ranks;
  for (int d = 0; d < dp; ++d) data_ranks.push_back(d * tp + layout.tensor_index(rank));
  // Group ids: tensor groups 0..dp-1, data groups dp..dp+tp-1.
  auto tensor_id = static_cast<std::int32_t>(layout.data_index(rank));
  auto data_id = static_cast<std::int32_t>(dp + layout.tensor_index(rank));
  return {std::make_shared<Group>(tensor_id, tensor_ranks, rank, inbox_, timeout_),
          std::make_shared<Group>(data_id, data_ranks, rank, inbox_, timeout_)};
}

}  // namespace stagehand
