#include "stagehand/checkpoint/save/in_process_save.hpp"

#include <thread>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/metadata/gather.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"

namespace stagehand {

Result<std::vector<RankSaveReport>> save_checkpoint_in_process(const std::string& root, std::int64_t step,
                                                               const std::vector<SaveEngine*>& engines,
                                                               const std::vector<const StateDict*>& states,
                                                               std::shared_ptr<FileSystem> fs) {
  if (engines.size() != states.size() || engines.empty()) {
    return Status{ErrorCode::invalid_argument, "one state per engine is needed"};
  }
  // The plan the coordinator would make: every rank's blocks, replicas written once.
  SH_ASSIGN_OR_RETURN(std::vector<StateDict> planned, planned_states(states, step));
  const CheckpointStore store(std::move(fs), root);
  SH_ASSIGN_OR_RETURN(const std::string policy, store.prepare(step));
  std::vector<RankSaveReport> reports(engines.size());
  std::vector<std::thread> ranks;
  for (std::size_t i = 0; i < engines.size(); ++i) {
    ranks.emplace_back([&, i] { reports[i] = engines[i]->save(planned[i], policy, step); });
  }
  for (auto& t : ranks) t.join();
  std::vector<const StateDict*> saved;
  for (const StateDict& s : planned) saved.push_back(&s);
  auto metadata = gather_reports(step, reports, static_cast<int>(engines.size()), descriptors_of_states(saved));
  Status committed = metadata.is_ok() ? store.commit(step, *metadata).status() : metadata.status();
  if (!committed.is_ok()) {
    (void)store.abort(step);
    return committed;
  }
  return reports;
}

}  // namespace stagehand
