#include "stagehand/checkpoint/in_process_save.hpp"

#include <thread>

#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/checkpoint/format.hpp"

namespace stagehand {

Result<std::vector<RankSaveReport>> save_checkpoint_in_process(const std::string& root, std::int64_t step,
                                                               const std::vector<SaveEngine*>& engines,
                                                               const std::vector<const StateDict*>& states) {
  if (engines.size() != states.size() || engines.empty()) {
    return Status{ErrorCode::invalid_argument, "one state per engine is needed"};
  }
  SH_ASSIGN_OR_RETURN(std::string tmp, prepare_checkpoint_dir(root, step));
  const std::string policy = CheckpointLayout::policy_dir(tmp);
  std::vector<RankSaveReport> reports(engines.size());
  std::vector<std::thread> ranks;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    ranks.emplace_back([&, i] { reports[i] = engines[i]->save(*states[i], policy, step); });
  }
  for (auto& t : ranks) t.join();
  SH_RETURN_IF_ERROR(commit_checkpoint(root, step, reports, static_cast<int>(engines.size())));
  return reports;
}

}  // namespace stagehand
