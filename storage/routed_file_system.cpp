#include "stagehand/storage/routed_file_system.hpp"

#include <condition_variable>
#include <mutex>
#include <vector>

namespace stagehand {

namespace {

std::string trimmed(std::string folder) {
  while (folder.size() > 1 && folder.ends_with("/")) folder.pop_back();
  return folder;
}

class Router final : public RoutedFileSystem {
 public:
  Router(std::shared_ptr<FileSystem> local, std::chrono::milliseconds limit) : local_(std::move(local)), limit_(limit) {}

  void expect_route(const std::string& folder, const std::string& what) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Route& r = route_locked(trimmed(folder));
    r.what = what;
    r.fs.reset();
    r.failure = Status::ok();
  }

  void set_route(const std::string& folder, std::shared_ptr<FileSystem> fs) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Route& r = route_locked(trimmed(folder));
      r.fs = std::move(fs);
      r.failure = Status::ok();
    }
    cv_.notify_all();
  }

  void fail_route(const std::string& folder, Status why) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Route& r = route_locked(trimmed(folder));
      r.fs.reset();
      r.failure = std::move(why);
    }
    cv_.notify_all();
  }

  FileSystemCapabilities capabilities(const std::string& path) const override {
    std::shared_ptr<FileSystem> fs;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const Route* r = find_locked(path);
      fs = r == nullptr ? local_ : r->fs;
    }
    // A folder whose file system is not there yet is one of another host's POSIX folders.
    return fs ? fs->capabilities(path) : FileSystemCapabilities{};
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->create_file(path);
  }
  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->open_file(path);
  }
  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->create_file_uncached(path);
  }
  Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->open_file_uncached(path);
  }
  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings* mappings) override {
    SH_ASSIGN_OR_RETURN(auto fs, of_both(from, to));
    return fs->reuse_file(from, to, mappings);
  }
  Result<std::unique_ptr<WritableFile>> reuse_file_uncached(const std::string& from, const std::string& to,
                                                            FileMappings* mappings) override {
    SH_ASSIGN_OR_RETURN(auto fs, of_both(from, to));
    return fs->reuse_file_uncached(from, to, mappings);
  }
  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->stat_file(path);
  }
  Status remove_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->remove_file(path);
  }
  Status create_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->create_dir(path);
  }
  Result<bool> is_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->is_dir(path);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->list_dir(path);
  }
  Status remove_tree(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->remove_tree(path);
  }
  Status sync_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->sync_dir(path);
  }
  Status rename(const std::string& from, const std::string& to) override {
    SH_ASSIGN_OR_RETURN(auto fs, of_both(from, to));
    return fs->rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    SH_ASSIGN_OR_RETURN(auto fs, of_both(a, b));
    return fs->exchange(a, b);
  }
  Status check_access(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->check_access(path);
  }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, const std::string& holder) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->lock_file(path, holder);
  }
  Result<int> abort_unfinished_writes(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto fs, of(path));
    return fs->abort_unfinished_writes(path);
  }

 private:
  struct Route {
    std::string folder;
    std::string what;
    std::shared_ptr<FileSystem> fs;
    Status failure;
  };

  Route& route_locked(const std::string& folder) {
    for (auto& r : routes_) {
      if (r.folder == folder) return r;
    }
    routes_.push_back({folder, "'" + folder + "'", nullptr, Status::ok()});
    return routes_.back();
  }

  /// The route of the longest folder holding `path`; null when none does.
  const Route* find_locked(const std::string& path) const {
    const Route* best = nullptr;
    for (const auto& r : routes_) {
      if (path_within(path, r.folder) && (best == nullptr || r.folder.size() > best->folder.size())) best = &r;
    }
    return best;
  }

  /// The file system of `path`, once its route is set; an error when it failed or was not set
  /// within the limit.
  Result<std::shared_ptr<FileSystem>> of(const std::string& path) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + limit_;
    for (;;) {
      const Route* r = find_locked(path);
      if (r == nullptr) return local_;
      if (r->fs) return r->fs;
      if (!r->failure.is_ok()) return r->failure.with_context("'" + path + "'");
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        r = find_locked(path);
        if (r != nullptr && r->fs) return r->fs;
        const std::string what = r == nullptr ? std::string("its folder") : r->what;
        return Status{ErrorCode::timeout, "'" + path + "': " + what + " was not reachable within " +
                                              std::to_string(limit_.count()) + " ms"};
      }
    }
  }

  /// The one file system of both paths; invalid_argument when they lie on two.
  Result<std::shared_ptr<FileSystem>> of_both(const std::string& a, const std::string& b) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (find_locked(a) != find_locked(b)) {
        return Status{ErrorCode::invalid_argument,
                      "cannot move '" + a + "' to '" + b + "': they lie in folders of different file systems"};
      }
    }
    return of(a);
  }

  std::shared_ptr<FileSystem> local_;
  std::chrono::milliseconds limit_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Route> routes_;
};

}  // namespace

std::shared_ptr<RoutedFileSystem> RoutedFileSystem::create(std::shared_ptr<FileSystem> local,
                                                           std::chrono::milliseconds wait_limit) {
  return std::make_shared<Router>(std::move(local), wait_limit);
}

}  // namespace stagehand
