#pragma once

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <functional>
#include <string>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand::test {

/// Rewrites the metadata.json of `ckpt` after `edit` changed it (tests that damage checkpoints).
inline void edit_metadata(const std::string& ckpt, const std::function<void(CheckpointMetadata&)>& edit) {
  auto metadata = read_checkpoint_metadata(ckpt);
  BOOST_REQUIRE_MESSAGE(metadata.is_ok(), metadata.status().to_string());
  edit(*metadata);
  std::ofstream(ckpt + "/policy/metadata.json") << metadata_to_json(*metadata);
}

}  // namespace stagehand::test
