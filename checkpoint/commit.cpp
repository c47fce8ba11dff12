#include "stagehand/checkpoint/commit.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "stagehand/core/log.hpp"
#include "stagehand/storage/local_files.hpp"

namespace fs = std::filesystem;

namespace stagehand {

namespace {

Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::from_errno(errno, "cannot create folder '" + path + "'");
  }
  return Status::ok();
}

Status remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Status::from_errno(ec.value(), "cannot remove '" + path + "'");
  return Status::ok();
}

/// Replaces the tracker: temp file, fsync, rename. The temp file does not outlive a failure: it
/// would sit in the root until someone removed it by hand.
Status write_tracker(StorageBackend& storage, const CheckpointLayout& layout, std::int64_t step) {
  const std::string path = layout.tracker();
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(step) + "\n";
  Status st = [&]() -> Status {
    SH_ASSIGN_OR_RETURN(auto file, storage.open_for_write(tmp));
    SH_RETURN_IF_ERROR(file->append(text.data(), text.size()));
    SH_RETURN_IF_ERROR(file->sync());
    SH_RETURN_IF_ERROR(file->close());
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return Status::from_errno(errno, "cannot rename '" + tmp + "' to '" + path + "'");
    }
    return Status::ok();
  }();
  if (!st.is_ok()) ::unlink(tmp.c_str());
  return st;
}

std::string trim_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

std::optional<std::int64_t> parse_step_dir_name(const std::string& name, bool tmp) {
  static const std::string kPrefix = "global_step_";
  static const std::string kTmp = ".tmp";
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  std::string digits = name.substr(kPrefix.size());
  if (tmp) {
    if (digits.size() <= kTmp.size() || digits.substr(digits.size() - kTmp.size()) != kTmp) {
      return std::nullopt;
    }
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
  if (!step) return Status{ErrorCode::corruption, "tracker '" + where + "' does not hold a step number"};
  return *step;
}

Status check_checkpoint_root(const std::string& root) {
  if (root.empty()) return {ErrorCode::invalid_argument, "ckpt_path is empty"};
  std::error_code ec;
  if (fs::is_directory(root, ec)) return Status::ok();
  if (fs::exists(root, ec)) return {ErrorCode::invalid_argument, "ckpt_path '" + root + "' is not a folder"};
  std::string parent = checkpoint_root_parent(root);
  if (!fs::is_directory(parent, ec)) {
    return {ErrorCode::not_found, "the parent folder '" + parent + "' of ckpt_path '" + root + "' does not exist"};
  }
  return Status::ok();
}

std::string checkpoint_root_parent(const std::string& root) {
  std::error_code ec;
  fs::path path = fs::absolute(root, ec).lexically_normal();
  // "a/b/" names the folder b: its path has an empty last element.
  if (!path.has_filename()) path = path.parent_path();
  return path.parent_path().string();
}

Result<std::string> prepare_checkpoint_dir(const std::string& root, std::int64_t step) {
  if (step < 0) return Status{ErrorCode::invalid_argument, "negative step " + std::to_string(step)};
  SH_RETURN_IF_ERROR(check_checkpoint_root(root));
  std::error_code ec;
  if (!fs::is_directory(root, ec)) SH_RETURN_IF_ERROR(make_dir(root).with_context("ckpt_path"));
  CheckpointLayout layout{root};
  std::string tmp = layout.tmp_dir(step);
  SH_RETURN_IF_ERROR(remove_tree(tmp));
  SH_RETURN_IF_ERROR(make_dir(tmp).with_context("ckpt_path"));
  SH_RETURN_IF_ERROR(make_dir(CheckpointLayout::policy_dir(tmp)));
  return tmp;
}

Result<GatheredMetadata> gather_reports(std::int64_t step, const std::vector<RankSaveReport>& reports,
                                        int world_size) {
  GatheredMetadata m;
  m.step = step;
  std::set<int> ranks;
  for (const auto& r : reports) {
    if (!r.status.is_ok()) return r.status.with_context("rank " + std::to_string(r.rank) + " failed");
    if (r.step != step) {
      return Status{ErrorCode::internal, "rank " + std::to_string(r.rank) + " reported step " +
                                             std::to_string(r.step) + " for step " + std::to_string(step)};
    }
    if (r.rank < 0 || r.rank >= world_size || !ranks.insert(r.rank).second) {
      return Status{ErrorCode::internal,
                    "rank " + std::to_string(r.rank) + " reported twice or is outside the world"};
    }
  }
  if (static_cast<int>(ranks.size()) != world_size) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (ranks.count(rank) == 0) {
        return Status{ErrorCode::aborted, "rank " + std::to_string(rank) + " did not report"};
      }
    }
  }
  // In rank order, so that the chunks of a tensor split by rank arrive already sorted.
  std::vector<const RankSaveReport*> by_rank;
  by_rank.reserve(reports.size());
  for (const auto& r : reports) by_rank.push_back(&r);
  std::sort(by_rank.begin(), by_rank.end(),
            [](const RankSaveReport* a, const RankSaveReport* b) { return a->rank < b->rank; });
  // One pass over the reports in the order they lie in memory: each chunk finds its tensor by
  // hash and is checked against the one before it, so that the writer's later pass, tensor by
  // tensor, is the only one that jumps between reports.
  struct Gathering {
    GatheredTensor gathered;
    /// Elements the chunks hold, to be compared with the global shape's.
    std::int64_t covered = 0;
    bool sorted = true;
  };
  std::unordered_map<std::string_view, Gathering> by_name;
  for (const RankSaveReport* report : by_rank) {
    const RankSaveReport& r = *report;
    for (const auto& [name, value] : r.objects) {
      if (!is_valid_utf8(name) || !is_valid_utf8(value)) {
        return Status{ErrorCode::invalid_argument, "object '" + name + "' of rank " + std::to_string(r.rank) +
                                                       ": its name and value must be UTF-8 text (JSON holds no other)"};
      }
      auto [it, inserted] = m.objects.emplace(name, value);
      if (!inserted && it->second != value) {
        return Status{ErrorCode::invalid_argument,
                      "object '" + name + "' differs between ranks; give per-rank objects per-rank names"};
      }
    }
    for (const auto& b : r.buckets) {
      if (!m.files.emplace(b.file, FileMeta{b.size, b.xxh3}).second) {
        return Status{ErrorCode::internal, "file '" + b.file + "' reported twice"};
      }
      for (const auto& c : b.chunks) {
        auto [found, inserted] = by_name.try_emplace(c.desc.name);
        Gathering& t = found->second;
        if (inserted) {
          if (!is_valid_utf8(c.desc.name)) {
            return Status{ErrorCode::invalid_argument,
                          "tensor '" + c.desc.name + "': its name must be UTF-8 text (JSON holds no other)"};
          }
          t.gathered.name = c.desc.name;
          t.gathered.dtype = c.desc.dtype;
          t.gathered.global_shape = c.desc.global_shape;
        } else if (t.gathered.dtype != c.desc.dtype || !(t.gathered.global_shape == c.desc.global_shape)) {
          return Status{ErrorCode::invalid_argument,
                        "tensor '" + c.desc.name + "' has a different dtype or global shape on rank " +
                            std::to_string(r.rank)};
        }
        if (!t.gathered.chunks.empty() && !(t.gathered.chunks.back().record->desc.global_offset < c.desc.global_offset)) {
          t.sorted = false;
        }
        t.gathered.chunks.push_back({&c, &b.file});
        t.covered += c.desc.local_shape.numel();
      }
    }
  }
  // In name order, so that of several bad tensors the first by name is the one reported.
  std::vector<Gathering*> by_order;
  by_order.reserve(by_name.size());
  for (auto& [name, t] : by_name) by_order.push_back(&t);
  std::sort(by_order.begin(), by_order.end(),
            [](const Gathering* a, const Gathering* b) { return a->gathered.name < b->gathered.name; });
  m.tensors.reserve(by_order.size());
  for (Gathering* t : by_order) {
    GatheredTensor& g = t->gathered;
    const std::string name(g.name);
    auto offsets = [](const GatheredChunk& c) -> const Shape& { return c.record->desc.global_offset; };
    if (!t->sorted) {
      std::sort(g.chunks.begin(), g.chunks.end(),
                [&](const GatheredChunk& a, const GatheredChunk& b) { return offsets(a) < offsets(b); });
      for (std::size_t i = 1; i < g.chunks.size(); ++i) {
        if (offsets(g.chunks[i]) == offsets(g.chunks[i - 1])) {
          return Status{ErrorCode::invalid_argument, "tensor '" + name + "' has two chunks at " +
                                                         offsets(g.chunks[i]).to_string() + " with replica id 0"};
        }
      }
    }
    if (t->covered != g.global_shape.numel()) {
      return Status{ErrorCode::invalid_argument,
                    "tensor '" + name + "': the saved chunks hold " + std::to_string(t->covered) + " of its " +
                        std::to_string(g.global_shape.numel()) + " elements (a block with no replica 0?)"};
    }
    m.tensors.push_back(std::move(g));
  }
  return m;
}

Result<std::optional<FileMeta>> trainer_state_meta(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/" + kTrainerStateFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<FileMeta>{};
  SH_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
  return std::optional<FileMeta>{FileMeta{text.size(), xxh3(text.data(), text.size())}};
}

Status abort_checkpoint(const std::string& root, std::int64_t step) {
  return remove_tree(CheckpointLayout{root}.tmp_dir(step));
}

Status commit_checkpoint(const std::string& root, std::int64_t step,
                         const std::vector<RankSaveReport>& reports, int world_size, StorageBackend& storage) {
  CheckpointLayout layout{root};
  std::string tmp = layout.tmp_dir(step);
  std::string final_dir = layout.step_dir(step);
  // The caller names the step and says it is not committed (the coordinator does, once).
  auto fail = [&](const Status& st) {
    (void)abort_checkpoint(root, step);
    return st;
  };
  // Once renamed, the step's folder is complete and stays: what is missing is the tracker.
  auto tracker_not_updated = [&](const Status& st) {
    auto tracked = read_tracker(root);
    std::string now = !tracked.is_ok() ? "cannot be read"
                      : *tracked        ? "still names step " + std::to_string(**tracked)
                                        : "does not exist yet";
    return st.with_context("the folder '" + final_dir + "' is complete and in place, but the tracker '" +
                           layout.tracker() + "' was not updated (it " + now + ")");
  };
  auto metadata = gather_reports(step, reports, world_size);
  if (!metadata.is_ok()) return fail(metadata.status());
  auto trainer_state = trainer_state_meta(tmp);
  if (!trainer_state.is_ok()) return fail(trainer_state.status());
  metadata->trainer_state = *trainer_state;
  std::string policy = CheckpointLayout::policy_dir(tmp);
  Status st = write_file_atomic(policy + "/" + kMetadataFile,
                                [&](WritableFile& file) { return write_metadata_json(*metadata, file); });
  if (st.is_ok()) st = fsync_dir(tmp);
  if (!st.is_ok()) return fail(st);

  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Swap atomically so that a committed copy of this step exists at every instant.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      return fail(Status::from_errno(errno, "cannot swap '" + tmp + "' with '" + final_dir + "'"));
    }
    st = fsync_dir(root);
    if (st.is_ok()) st = remove_tree(tmp);
    if (!st.is_ok()) return tracker_not_updated(st);
  } else if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return fail(Status::from_errno(errno, "cannot rename '" + tmp + "' to '" + final_dir + "'"));
  }
  st = fsync_dir(root);
  if (st.is_ok()) st = write_tracker(storage, layout, step);
  if (!st.is_ok()) return tracker_not_updated(st);
  return fsync_dir(root).with_context("the tracker '" + layout.tracker() + "' names step " + std::to_string(step) +
                                      ", but its rename may not survive a crash");
}

Result<std::optional<std::int64_t>> read_tracker(const std::string& root) {
  std::string path = CheckpointLayout{root}.tracker();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<std::int64_t>{};
  SH_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
  SH_ASSIGN_OR_RETURN(std::int64_t step, parse_tracker(std::move(text), path));
  return std::optional<std::int64_t>{step};
}

std::vector<std::int64_t> committed_steps(const std::string& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    auto step = parse_step_dir_name(entry.path().filename().string(), false);
    if (step && fs::exists(CheckpointLayout::policy_dir(entry.path().string()) + "/" + kMetadataFile, ec)) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<int> clean_stale_tmp_dirs(const std::string& root) {
  int removed = 0;
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (parse_step_dir_name(entry.path().filename().string(), true)) stale.push_back(entry.path().string());
  }
  for (const auto& path : stale) {
    logger()->info("removing '{}', left by an interrupted save", path);
    SH_RETURN_IF_ERROR(remove_tree(path));
    ++removed;
  }
  return removed;
}

Result<CheckpointRootLock> CheckpointRootLock::acquire(const std::string& root) {
  SH_RETURN_IF_ERROR(check_checkpoint_root(root));
  std::error_code ec;
  if (!fs::is_directory(root, ec)) SH_RETURN_IF_ERROR(make_dir(root).with_context("ckpt_path"));
  const std::string path = root + "/" + kRootLockFile;
  // Close-on-exec: a child the run starts must not keep the lock after the run ends.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::from_errno(errno, "cannot open the lock file '" + path + "'");
  CheckpointRootLock lock(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Status::from_errno(errno, "cannot lock '" + path + "'");
    auto record = read_small_file(path);
    std::string holder = record.is_ok() ? trim_line(*record) : "";
    if (holder.empty()) holder = "which has not recorded its host and pid yet";
    return Status{ErrorCode::already_exists,
                  "ckpt_path '" + root + "' is in use by another run (" + holder + ", recorded in '" + path +
                      "'); two runs on one ckpt_path would remove and overwrite each other's checkpoints: wait "
                      "for that run to end or give this one another trainer.ckpt_path"};
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string record = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size())) {
    return Status::from_errno(errno, "cannot record the holder in '" + path + "'");
  }
  return lock;
}

CheckpointRootLock::CheckpointRootLock(CheckpointRootLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

CheckpointRootLock& CheckpointRootLock::operator=(CheckpointRootLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

CheckpointRootLock::~CheckpointRootLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace stagehand
