#include "stagehand/checkpoint/format/layout.hpp"

namespace stagehand {

std::string CheckpointLayout::step_dir(std::int64_t step) const {
  return root + "/global_step_" + std::to_string(step);
}

std::string CheckpointLayout::tmp_dir(std::int64_t step) const {
  return step_dir(step) + ".tmp";
}

std::string CheckpointLayout::tracker() const {
  return root + "/" + kTrackerFile;
}

std::string CheckpointLayout::policy_dir(const std::string& checkpoint_dir) {
  return checkpoint_dir + "/" + kPolicyDir;
}

std::string CheckpointLayout::bucket_file_name(int rank, int bucket) {
  return "__" + std::to_string(rank) + "_" + std::to_string(bucket) + ".safetensors";
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace stagehand
