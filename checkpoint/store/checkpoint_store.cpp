#include "stagehand/checkpoint/store/checkpoint_store.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

namespace {

std::string trim_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  return path;
}

}  // namespace

std::optional<std::int64_t> parse_step_dir_name(const std::string& name, bool tmp) {
  static const std::string kPrefix = "global_step_";
  static const std::string kTmp = ".tmp";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  std::string digits = name.substr(kPrefix.size());
  if (tmp) {
    if (digits.size() <= kTmp.size() || !digits.ends_with(kTmp)) return std::nullopt;
    digits.resize(digits.size() - kTmp.size());
  }
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

Result<std::int64_t> parse_tracker(std::string text, const std::string& where) {
  auto step = parse_step_dir_name("global_step_" + trim_line(std::move(text)), false);
  if (!step)
    return Status{ErrorCode::corruption, "tracker '" + where + "' does not hold a step number"};
  return *step;
}

Result<std::optional<std::int64_t>> read_tracker(FileSystem& fs, const std::string& root) {
  const std::string path = CheckpointLayout{root}.tracker();
  SH_ASSIGN_OR_RETURN(auto text, read_small_file(fs, path));
  if (!text) return std::optional<std::int64_t>{};
  SH_ASSIGN_OR_RETURN(std::int64_t step, parse_tracker(std::move(*text), path));
  return std::optional<std::int64_t>{step};
}

CheckpointStore::CheckpointStore(std::shared_ptr<FileSystem> fs, std::string root)
    : fs_(std::move(fs)), root_(without_trailing_slash(std::move(root))) {}

CheckpointStore CheckpointStore::open(const std::string& root, const ObjectStoreOptions& options) {
  return CheckpointStore(default_file_system(options), root);
}

std::string CheckpointStore::step_dir(std::int64_t step) const {
  return layout().step_dir(step);
}

std::string CheckpointStore::write_dir(std::int64_t step) const {
  return in_place() ? layout().step_dir(step) : layout().tmp_dir(step);
}

bool CheckpointStore::allows_async_saves() const {
  return !fs_->capabilities(root_).uploads;
}

bool CheckpointStore::in_place() const {
  return !fs_->capabilities(root_).atomic_rename;
}

std::string CheckpointStore::metadata_path(const std::string& checkpoint_dir) const {
  return CheckpointLayout::policy_dir(checkpoint_dir) + "/" + kMetadataFile;
}

Status CheckpointStore::create_root() const {
  // Where folders are key prefixes there is nothing to make or sync (create_dir checks the URL).
  if (!fs_->capabilities(root_).directories)
    return fs_->create_dir(root_).with_context("ckpt_path");
  SH_ASSIGN_OR_RETURN(bool exists, fs_->is_dir(root_));
  if (exists) return Status::ok();
  SH_RETURN_IF_ERROR(fs_->create_dir(root_).with_context("ckpt_path"));
  // Until its parent is synced, a power loss may take the new root with every step below it.
  return fs_->sync_dir(parent_path(root_)).with_context("ckpt_path");
}

// -- before the first save --

Status CheckpointStore::check_destination() const {
  if (root_.empty()) return {ErrorCode::invalid_argument, "ckpt_path is empty"};
  auto context = [&](const Status& st) { return st.with_context("ckpt_path '" + root_ + "'"); };
  // Where folders are key prefixes there is nothing to find first: reaching the store is the check.
  if (!fs_->capabilities(root_).directories) return context(fs_->check_access(root_));
  SH_ASSIGN_OR_RETURN(bool is_dir, fs_->is_dir(root_));
  if (is_dir) return context(fs_->check_access(root_));
  SH_ASSIGN_OR_RETURN(auto file, fs_->stat_file(root_));
  if (file) return {ErrorCode::invalid_argument, "ckpt_path '" + root_ + "' is not a folder"};
  const std::string parent = parent_path(root_);
  SH_ASSIGN_OR_RETURN(bool parent_is_dir, fs_->is_dir(parent));
  if (!parent_is_dir) {
    return {ErrorCode::not_found,
            "the parent folder '" + parent + "' of ckpt_path '" + root_ + "' does not exist"};
  }
  return context(fs_->check_access(parent));
}

Result<std::unique_ptr<FileLock>> CheckpointStore::lock() const {
  if (!fs_->capabilities(root_).locks) return std::unique_ptr<FileLock>{};
  SH_RETURN_IF_ERROR(check_destination());
  SH_RETURN_IF_ERROR(create_root());
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string holder =
      "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + "\n";
  const std::string path = root_ + "/" + kRootLockFile;
  auto lock = fs_->lock_file(path, holder);
  if (!lock.is_ok() && lock.status().code() == ErrorCode::already_exists) {
    return Status{ErrorCode::already_exists,
                  "ckpt_path '" + root_ + "' is in use by another run (" + lock.status().message() +
                      "); two runs on one ckpt_path would remove and overwrite each other's "
                      "checkpoints: wait "
                      "for that run to end or give this one another trainer.ckpt_path"};
  }
  return lock;
}

Result<int> CheckpointStore::clean_interrupted() const {
  int cleaned = 0;
  SH_ASSIGN_OR_RETURN(auto entries, fs_->list_dir(root_));
  for (const auto& e : entries) {
    const std::string path = root_ + "/" + e.name;
    if (e.is_dir && parse_step_dir_name(e.name, true)) {
      logger()->info("removing '{}', left by an interrupted save", path);
      SH_RETURN_IF_ERROR(fs_->remove_tree(path));
      ++cleaned;
    } else if (e.is_dir && e.name == kSpareFilesDir) {
      // Retired data files a run kept to write over (file_reuse.hpp); a file system that
      // reuses them hides the folder, so here nothing will: they are a step's worth of disk.
      logger()->info("removing '{}', retired files left by an earlier run", path);
      SH_RETURN_IF_ERROR(fs_->remove_tree(path));
      ++cleaned;
    } else if (!e.is_dir && e.name == std::string(kTrackerFile) + ".tmp") {
      logger()->info("removing '{}', left by an interrupted tracker update", path);
      SH_RETURN_IF_ERROR(fs_->remove_file(path));
      ++cleaned;
    }
  }
  if (in_place()) {
    for (const auto& e : entries) {
      auto step = e.is_dir ? parse_step_dir_name(e.name, false) : std::nullopt;
      if (!step) continue;
      SH_ASSIGN_OR_RETURN(bool committed, is_committed(*step));
      if (committed) continue;
      // Said before removing, so that a run that dies here has still named what it removed.
      logger()->info("removing the files of uncommitted step {} under '{}'", *step, root_);
      SH_RETURN_IF_ERROR(fs_->remove_tree(step_dir(*step)));
      ++cleaned;
    }
    SH_ASSIGN_OR_RETURN(int unfinished, fs_->abort_unfinished_writes(root_));
    if (unfinished > 0)
      logger()->info("aborted {} unfinished upload(s) under '{}'", unfinished, root_);
    cleaned += unfinished;
  }
  return cleaned;
}

// -- saving one step --

Result<std::string> CheckpointStore::prepare(std::int64_t step) const {
  if (step < 0) return Status{ErrorCode::invalid_argument, "negative step " + std::to_string(step)};
  SH_RETURN_IF_ERROR(check_destination());
  if (in_place()) {
    SH_ASSIGN_OR_RETURN(bool committed, is_committed(step));
    if (committed) {
      return Status{ErrorCode::already_exists,
                    "step " + std::to_string(step) + " is already committed at '" + step_dir(step) +
                        "'; an object store cannot replace it atomically, so it is "
                        "not overwritten"};
    }
  }
  SH_RETURN_IF_ERROR(create_root());
  const std::string dir = write_dir(step);
  SH_RETURN_IF_ERROR(fs_->remove_tree(dir));
  SH_RETURN_IF_ERROR(fs_->create_dir(dir));
  const std::string policy = CheckpointLayout::policy_dir(dir);
  SH_RETURN_IF_ERROR(fs_->create_dir(policy));
  return policy;
}

Result<FileMeta> CheckpointStore::write_trainer_state(std::int64_t step,
                                                      const std::string& text) const {
  SH_RETURN_IF_ERROR(write_file_atomic(*fs_, write_dir(step) + "/" + kTrainerStateFile, text));
  return FileMeta{text.size(), xxh3(text.data(), text.size())};
}

Status CheckpointStore::write_tracker(std::int64_t step) const {
  return write_file_atomic(*fs_, layout().tracker(), std::to_string(step) + "\n");
}

Result<CommitReport> CheckpointStore::commit(std::int64_t step,
                                             const GatheredMetadata& metadata) const {
  CommitReport report;
  for (const auto& [name, file] : metadata.files) {
    ++report.files;
    report.bytes += file.size;
  }
  SH_RETURN_IF_ERROR(
      publish(step, [&](WritableFile& file) { return write_metadata_json(metadata, file); }));
  return report;
}

Status CheckpointStore::commit_copy(std::int64_t step, const std::string& metadata_json) const {
  return publish(step, [&](WritableFile& file) {
    SH_RETURN_IF_ERROR(file.append(metadata_json.data(), metadata_json.size()));
    return Status::ok();
  });
}

Status CheckpointStore::publish(std::int64_t step,
                                const std::function<Status(WritableFile&)>& write_metadata) const {
  const std::string dir = write_dir(step);
  const std::string final_dir = step_dir(step);
  auto fail = [&](const Status& st) -> Status {
    (void)abort(step);
    return st;
  };
  // Once in place, the step's folder is complete and stays: what is missing is the tracker.
  auto tracker_not_updated = [&](const Status& st) -> Status {
    auto tracked = tracker();
    std::string now = !tracked.is_ok() ? "cannot be read"
                      : *tracked       ? "still names step " + std::to_string(**tracked)
                                       : "does not exist yet";
    return st.with_context("the folder '" + final_dir +
                           "' is complete and in place, but the tracker '" + layout().tracker() +
                           "' was not updated (it " + now + ")");
  };
  Status st = write_file_atomic(*fs_, metadata_path(dir), write_metadata);
  // The step folder's entries (policy/, trainer_state.json) become durable with it.
  if (st.is_ok()) st = fs_->sync_dir(dir);
  if (!st.is_ok()) return fail(st);
  if (!in_place()) {
    SH_ASSIGN_OR_RETURN(bool replacing, fs_->is_dir(final_dir));
    if (replacing) {
      // Swapped atomically so that a committed copy of this step exists at every instant.
      st = fs_->exchange(dir, final_dir);
      if (!st.is_ok()) return fail(st);
      st = fs_->sync_dir(root_);
      if (st.is_ok()) st = fs_->remove_tree(dir);
      if (!st.is_ok()) return tracker_not_updated(st);
    } else {
      st = fs_->rename(dir, final_dir);
      if (!st.is_ok()) return fail(st);
    }
    // The rename must be durable before the tracker names it.
    st = fs_->sync_dir(root_);
    if (!st.is_ok()) return tracker_not_updated(st);
  }
  st = write_tracker(step);
  if (!st.is_ok()) return tracker_not_updated(st);
  return Status::ok();
}

Status CheckpointStore::abort(std::int64_t step) const {
  if (in_place()) {
    // A tracker write whose answer was lost may still have landed: then the step is committed.
    auto tracked = tracker();
    if (tracked.is_ok() && *tracked == step) return Status::ok();
  }
  return fs_->remove_tree(write_dir(step));
}

// -- reading --

Result<std::optional<std::int64_t>> CheckpointStore::tracker() const {
  return read_tracker(*fs_, root_);
}

Result<bool> CheckpointStore::is_committed(std::int64_t step) const {
  auto exists = file_exists(*fs_, metadata_path(step_dir(step)));
  // Something other than a file in the metadata's place (a folder) is a damaged commit: it is
  // listed, so that a resume names it when it rejects it and retention removes it.
  if (!exists.is_ok() && exists.status().code() == ErrorCode::invalid_argument) return true;
  return exists;
}

Result<std::vector<std::int64_t>> CheckpointStore::committed_steps() const {
  std::vector<std::int64_t> steps;
  SH_ASSIGN_OR_RETURN(auto entries, fs_->list_dir(root_));
  for (const auto& e : entries) {
    auto step = e.is_dir ? parse_step_dir_name(e.name, false) : std::nullopt;
    if (!step) continue;
    SH_ASSIGN_OR_RETURN(bool committed, is_committed(*step));
    if (committed) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// -- retention --

Status CheckpointStore::remove_step(std::int64_t step) const {
  const std::string dir = step_dir(step);
  if (in_place()) {
    SH_RETURN_IF_ERROR(fs_->remove_file(metadata_path(dir)));
    return fs_->remove_tree(dir);
  }
  const std::string doomed = layout().tmp_dir(step);
  SH_RETURN_IF_ERROR(fs_->remove_tree(doomed).with_context("retention"));
  SH_RETURN_IF_ERROR(fs_->rename(dir, doomed)
                         .with_context("retention: cannot retire step " + std::to_string(step)));
  SH_RETURN_IF_ERROR(fs_->sync_dir(root_).with_context("retention"));
  return fs_->remove_tree(doomed).with_context("retention");
}

Result<std::vector<std::int64_t>> CheckpointStore::apply_retention(
    int keep, const std::set<std::int64_t>& in_use) const {
  std::vector<std::int64_t> removed;
  if (keep <= 0) return removed;
  SH_ASSIGN_OR_RETURN(auto newest, tracker());
  SH_ASSIGN_OR_RETURN(auto steps, committed_steps());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    if ((newest && steps[i] == *newest) || in_use.count(steps[i]) != 0) continue;
    SH_RETURN_IF_ERROR(remove_step(steps[i]));
    removed.push_back(steps[i]);
  }
  return removed;
}

}  // namespace stagehand
