#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// The synchronous in-process save of several ranks: makes the global plan of their states as
/// the coordinator does (make_global_plan: replicas written once, writers balanced), prepares
/// `global_step_N.tmp`, runs every rank's engine at once on its assigned blocks, gathers one
/// report per rank and commits only when all succeeded.
/// A seam for the checkpoint layer's own tests: programs save through the WorkerDispatch (see
/// actors/dispatch_client.hpp), which drives the same engines through the strategies.
/// @pre engines.size() == states.size(); engine i has rank i.
/// @param fs what the root is prepared and committed on (the engines write through their own).
/// @return the reports (for figures) or the first rank's error.
Result<std::vector<RankSaveReport>> save_checkpoint_in_process(const std::string& root, std::int64_t step,
                                                               const std::vector<SaveEngine*>& engines,
                                                               const std::vector<const StateDict*>& states,
                                                               std::shared_ptr<FileSystem> fs = local_file_system());

}  // namespace stagehand
