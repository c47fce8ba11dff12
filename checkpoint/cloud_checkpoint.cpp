#include "stagehand/checkpoint/cloud_checkpoint.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "stagehand/checkpoint/commit.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/storage/local_files.hpp"

namespace stagehand {

namespace {

std::string step_name(std::int64_t step) { return "global_step_" + std::to_string(step); }

}  // namespace

Result<CloudCheckpoints> CloudCheckpoints::open(const std::string& url, const ObjectStoreOptions& options) {
  SH_ASSIGN_OR_RETURN(ObjectUrl root, ObjectUrl::parse(url));
  SH_ASSIGN_OR_RETURN(auto bucket, Bucket::open(root.kind, root.bucket, options));
  return CloudCheckpoints(std::move(bucket), std::move(root));
}

std::string CloudCheckpoints::step_key(std::int64_t step) const { return root_.key_of(step_name(step)); }

std::string CloudCheckpoints::step_url(std::int64_t step) const { return bucket_->url(step_key(step)); }

std::string CloudCheckpoints::metadata_key(std::int64_t step) const {
  return step_key(step) + "/" + kPolicyDir + "/" + kMetadataFile;
}

Status CloudCheckpoints::check_access() const {
  return bucket_->check_access(root_.key.empty() ? "" : root_.key + "/");
}

Status CloudCheckpoints::upload_rank_files(std::int64_t step, const std::string& local_policy_dir,
                                           const std::vector<std::string>& files) const {
  std::vector<FileUpload> uploads;
  for (const auto& f : files) {
    uploads.push_back({local_policy_dir + "/" + f, step_key(step) + "/" + kPolicyDir + "/" + f});
  }
  return bucket_->upload_files(uploads);
}

Status CloudCheckpoints::commit(std::int64_t step, const GatheredMetadata& metadata,
                                const std::string& local_step_dir) const {
  std::string state_path = local_step_dir + "/" + kTrainerStateFile;
  std::error_code ec;
  if (std::filesystem::exists(state_path, ec)) {
    SH_ASSIGN_OR_RETURN(std::string state, read_small_file(state_path));
    SH_RETURN_IF_ERROR(bucket_->put(step_key(step) + "/" + kTrainerStateFile, state));
  }
  SH_RETURN_IF_ERROR(bucket_->put(metadata_key(step), metadata_to_json(metadata)));
  return bucket_->put(root_.key_of(kTrackerFile), std::to_string(step) + "\n");
}

Result<std::optional<std::int64_t>> CloudCheckpoints::read_tracker() const {
  std::string key = root_.key_of(kTrackerFile);
  SH_ASSIGN_OR_RETURN(auto text, bucket_->get(key));
  if (!text) return std::optional<std::int64_t>{};
  SH_ASSIGN_OR_RETURN(std::int64_t step, parse_tracker(std::move(*text), bucket_->url(key)));
  return std::optional<std::int64_t>{step};
}

Result<bool> CloudCheckpoints::is_committed(std::int64_t step) const {
  SH_ASSIGN_OR_RETURN(auto size, bucket_->size_of(metadata_key(step)));
  return size.has_value();
}

Result<std::map<std::int64_t, CloudCheckpoints::StepObjects>> CloudCheckpoints::objects_by_step() const {
  std::string base = root_.key.empty() ? "" : root_.key + "/";
  SH_ASSIGN_OR_RETURN(auto objects, bucket_->list(base + "global_step_"));
  std::map<std::int64_t, StepObjects> out;
  for (auto& o : objects) {
    std::string rest = o.key.substr(base.size());
    auto step = parse_step_dir_name(rest.substr(0, rest.find('/')), false);
    if (!step) continue;
    StepObjects& entry = out[*step];
    entry.committed |= o.key == metadata_key(*step);
    entry.objects.push_back(std::move(o));
  }
  return out;
}

Result<std::vector<std::int64_t>> CloudCheckpoints::committed_steps() const {
  SH_ASSIGN_OR_RETURN(auto by_step, objects_by_step());
  std::vector<std::int64_t> steps;
  for (const auto& [step, entry] : by_step) {
    if (entry.committed) steps.push_back(step);
  }
  return steps;
}

Status CloudCheckpoints::remove_step(std::int64_t step) const {
  SH_RETURN_IF_ERROR(bucket_->remove(metadata_key(step)));
  SH_ASSIGN_OR_RETURN(auto objects, bucket_->list(step_key(step) + "/"));
  for (const auto& o : objects) SH_RETURN_IF_ERROR(bucket_->remove(o.key));
  return Status::ok();
}

Result<int> CloudCheckpoints::clean_interrupted() const {
  int cleaned = 0;
  SH_ASSIGN_OR_RETURN(auto by_step, objects_by_step());
  for (const auto& [step, entry] : by_step) {
    if (entry.committed) continue;
    // Said before deleting, so that a run that dies here has still named what it was removing.
    logger()->info("removing {} object(s) of uncommitted step {} under '{}'", entry.objects.size(), step,
                   root_.str());
    for (const auto& o : entry.objects) SH_RETURN_IF_ERROR(bucket_->remove(o.key));
    ++cleaned;
  }
  SH_ASSIGN_OR_RETURN(auto uploads, bucket_->open_uploads(root_.key.empty() ? "" : root_.key + "/"));
  if (!uploads.empty()) {
    logger()->info("aborting {} open multipart upload(s) under '{}'", uploads.size(), root_.str());
  }
  for (const auto& u : uploads) {
    SH_RETURN_IF_ERROR(bucket_->abort_upload(u));
    ++cleaned;
  }
  return cleaned;
}

}  // namespace stagehand
