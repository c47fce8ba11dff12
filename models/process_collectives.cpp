#include "stagehand/models/process_collectives.hpp"

#include <caf/all.hpp>

#include "stagehand/models/gloo_group.hpp"
#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/rendezvous.hpp"

namespace stagehand {

ProcessCollectives::ProcessCollectives(caf::actor_system& system, std::string master_addr,
                                       std::chrono::milliseconds timeout, std::string timeout_setting)
    : system_(system),
      process_(std::make_shared<GlooProcess>(system, std::move(master_addr), timeout,
                                             std::move(timeout_setting))) {}

ProcessCollectives::~ProcessCollectives() {
  abort("shutting down");
  if (store_) caf::anon_send_exit(store_, caf::exit_reason::user_shutdown);
}

caf::actor ProcessCollectives::host_rendezvous() {
  if (!store_) store_ = spawn_rendezvous_store(system_);
  return store_;
}

void ProcessCollectives::set_rendezvous(caf::actor store) {
  process_->set_rendezvous(std::move(store));
}

void ProcessCollectives::abort(const std::string& reason) {
  process_->stop(reason);
}

Status ProcessCollectives::close(const std::string& reason) {
  std::lock_guard<std::mutex> closing(close_mutex_);
  const auto deadline = GlooGroup::Clock::now() + process_->limit();
  process_->stop(reason);
  std::vector<std::shared_ptr<GlooGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    for (auto& weak : groups_) {
      if (auto group = weak.lock()) groups.push_back(std::move(group));
    }
  }
  // Every group's goodbye goes out before any is awaited: a member still saying goodbye in one
  // group then never keeps its peers in another waiting.
  std::string failed;
  std::vector<std::shared_ptr<GlooGroup>> saying_goodbye;
  for (auto& group : groups) {
    auto started = group->start_farewell();
    if (!started.is_ok()) {
      failed += (failed.empty() ? "" : "; ") + started.status().message();
    } else if (*started) {
      saying_goodbye.push_back(group);
    }
  }
  ErrorCode code = ErrorCode::aborted;
  for (auto& group : saying_goodbye) {
    Status st = group->finish_farewell(deadline);
    if (st.is_ok()) continue;
    if (st.code() == ErrorCode::timeout) code = ErrorCode::timeout;
    failed += (failed.empty() ? "" : "; ") + st.message();
  }
  if (failed.empty()) return Status::ok();
  return Status{code, failed};
}

RankGroups ProcessCollectives::groups(const ParallelLayout& layout, int rank) {
  const int tp = layout.tensor_parallel;
  const int dp = layout.data_parallel;
  std::vector<int> tensor_ranks;
  for (int t = 0; t < tp; ++t)
    tensor_ranks.push_back(layout.data_index(rank) * tp + t);
  std::vector<int> data_ranks;
  for (int d = 0; d < dp; ++d)
    data_ranks.push_back(d * tp + layout.tensor_index(rank));
  auto tensor = std::make_shared<GlooGroup>(
      process_, "tensor-parallel " + std::to_string(layout.data_index(rank)),
      std::move(tensor_ranks), layout.tensor_index(rank));
  auto data = std::make_shared<GlooGroup>(
      process_, "data-parallel " + std::to_string(layout.tensor_index(rank)), std::move(data_ranks),
      layout.data_index(rank));
  std::lock_guard<std::mutex> lock(groups_mutex_);
  std::erase_if(groups_, [](const std::weak_ptr<GlooGroup>& group) { return group.expired(); });
  groups_.push_back(tensor);
  groups_.push_back(data);
  return {std::move(tensor), std::move(data)};
}

}  // namespace stagehand
