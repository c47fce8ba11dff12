#include "stagehand/models/process_collectives.hpp"

#include <caf/all.hpp>

#include "stagehand/models/gloo_group.hpp"
#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/rendezvous.hpp"

namespace stagehand {

ProcessCollectives::ProcessCollectives(caf::actor_system& system, std::string master_addr,
                                       std::chrono::milliseconds timeout)
    : system_(system),
      process_(std::make_shared<GlooProcess>(system, std::move(master_addr), timeout)) {}

ProcessCollectives::~ProcessCollectives() {
  close("shutting down");
  if (store_) caf::anon_send_exit(store_, caf::exit_reason::user_shutdown);
}

caf::actor ProcessCollectives::host_rendezvous() {
  if (!store_) store_ = spawn_rendezvous_store(system_);
  return store_;
}

void ProcessCollectives::set_rendezvous(caf::actor store) {
  process_->set_rendezvous(std::move(store));
}

void ProcessCollectives::close(const std::string& reason) {
  process_->stop(reason);
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
  return {std::make_shared<GlooGroup>(process_,
                                      "tensor-parallel " + std::to_string(layout.data_index(rank)),
                                      std::move(tensor_ranks), layout.tensor_index(rank)),
          std::make_shared<GlooGroup>(process_,
                                      "data-parallel " + std::to_string(layout.tensor_index(rank)),
                                      std::move(data_ranks), layout.data_index(rank))};
}

}  // namespace stagehand
