#include "stagehand/checkpoint/save/file_reuse.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include <spdlog/spdlog.h>

#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/core/log.hpp"

namespace stagehand {

namespace {

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class ReusingFileSystem final : public FileSystemWrapper {
 public:
  ReusingFileSystem(std::shared_ptr<FileSystem> inner, std::vector<std::string> roots)
      : FileSystemWrapper(std::move(inner)), roots_(std::move(roots)) {
    for (auto& root : roots_) {
      while (root.size() > 1 && root.back() == '/') root.pop_back();
    }
  }

  ~ReusingFileSystem() override {
    for (const auto& root : roots_) (void)inner().remove_tree(spares(root));
    if (const std::uint64_t n = reused_.load(); n > 0) {
      logger()->info("{} data file(s) of retired steps written over below '{}'{}", n, roots_.front(),
                     roots_.size() > 1 ? " and " + std::to_string(roots_.size() - 1) + " other folder(s)" : "");
    }
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override { return create(path, false); }

  /// A retired step's file written over around the page cache (reuse_file_uncached), or with
  /// none to take, a new file created so.
  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    return create(path, true);
  }
  /// Outside the local tier (the durable tier beside it) as `inner` does it.
  Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) override {
    return root_of(path) != nullptr ? open_file(path) : inner().open_file_uncached(path);
  }

  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto entries, inner().list_dir(path));
    if (is_root(path)) {
      std::erase_if(entries, [](const DirEntry& e) { return e.name == kSpareFilesDir; });
    }
    return entries;
  }

  Status remove_tree(const std::string& path) override {
    const std::string* root = root_of(path);
    if (root != nullptr && reuse_works_.load() && path != spares(*root)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (inner().create_dir(spares(*root)).is_ok()) keep_data_files(path, spares(*root), 0);
    }
    return inner().remove_tree(path);
  }

 private:
  /// A data file below a root takes a retired step's file to write over, when there is one.
  Result<std::unique_ptr<WritableFile>> create(const std::string& path, bool uncached) {
    const std::string* root = root_of(path);
    if (root != nullptr && reuse_works_.load() && data_file_rank(path) >= 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::string spare = spares(*root) + "/" + base_name(path);
      auto reused = uncached ? inner().reuse_file_uncached(spare, path, &mappings_[spare])
                             : inner().reuse_file(spare, path, &mappings_[spare]);
      if (reused.is_ok()) {
        ++reused_;
        return reused;
      }
      // None to take (not_found) or it cannot be taken: created as usual.
      if (reused.status().code() == ErrorCode::unsupported) reuse_works_ = false;
    }
    return uncached ? inner().create_file_uncached(path) : inner().create_file(path);
  }

  static std::string spares(const std::string& root) { return root + "/" + kSpareFilesDir; }

  bool is_root(const std::string& path) const {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return std::find(roots_.begin(), roots_.end(), p) != roots_.end();
  }

  /// The root strictly above `path`, or null.
  const std::string* root_of(const std::string& path) const {
    for (const auto& root : roots_) {
      if (path.size() > root.size() + 1 && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/') {
        return &root;
      }
    }
    return nullptr;
  }

  /// Moves the data files below `dir` into `spare_dir`. Best effort: a file that cannot be moved is
  /// removed with its folder, as without reuse.
  void keep_data_files(const std::string& dir, const std::string& spare_dir, int depth) {
    auto entries = inner().list_dir(dir);
    if (!entries.is_ok()) return;
    for (const auto& e : *entries) {
      const std::string path = dir + "/" + e.name;
      if (e.is_dir && depth < 2) {
        keep_data_files(path, spare_dir, depth + 1);
      } else if (!e.is_dir && data_file_rank(path) >= 0) {
        (void)inner().rename(path, spare_dir + "/" + e.name);
      }
    }
  }

  std::vector<std::string> roots_;
  std::mutex mutex_;
  /// By spare: the mappings of the files that were taken from there (one per file written over
  /// again, so each is mapped once; in memory-backed folders only).
  std::map<std::string, FileMappings> mappings_;
  /// False once `inner` said it cannot reuse files: nothing is kept from then on.
  std::atomic<bool> reuse_works_{true};
  /// Spares taken so far (logged at the end of the run).
  std::atomic<std::uint64_t> reused_{0};
};

}  // namespace

std::shared_ptr<FileSystem> reusing_file_system(std::shared_ptr<FileSystem> inner, std::vector<std::string> roots) {
  // Only below roots where reuses_files_at says so: on a FUSE or network mount a rename may be a
  // copy and a write into a file a read of it first; an object store has no folders. (A host's
  // folder reached through its file server is written over by the server, on its disk.)
  std::erase_if(roots, [&inner](const std::string& root) {
    if (reuses_files_at(*inner, root)) return false;
    if (inner->capabilities(root).directories) {
      logger()->info("'{}' is on a FUSE or network mount: saves there write new files, not over retired ones", root);
    }
    return true;
  });
  if (roots.empty()) return inner;
  return std::make_shared<ReusingFileSystem>(std::move(inner), std::move(roots));
}

bool reuses_files_at(const FileSystem& fs, const std::string& root) {
  const FileSystemCapabilities can = fs.capabilities(root);
  return can.directories && can.rewrites_in_place;
}

}  // namespace stagehand
