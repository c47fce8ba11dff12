#include "stagehand/checkpoint/tiers/host_folders.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/format/layout.hpp"

namespace stagehand {

// -- the placement --

Status HostPlacement::check() const {
  const std::string what = "the host folders '" + pattern + "'";
  if (pattern.find(kHostPlaceholder) == std::string::npos) {
    return {ErrorCode::invalid_argument, what + " hold no " + std::string(kHostPlaceholder)};
  }
  if (hosts < 1 || ranks_per_host < 1 || replicas < 1 || stride < 1) {
    return {ErrorCode::invalid_argument, what + ": hosts " + std::to_string(hosts) + ", ranks per host " +
                                             std::to_string(ranks_per_host) + ", replicas " + std::to_string(replicas) +
                                             " and stride " + std::to_string(stride) + " must all be at least 1"};
  }
  // Host h's copies land on h, h + stride, ...: distinct while replicas <= hosts / gcd(stride, hosts).
  const int distinct = hosts / std::gcd(stride, hosts);
  if (replicas > distinct) {
    return {ErrorCode::invalid_argument, what + ": " + std::to_string(replicas) + " copies of each rank's files with stride " +
                                             std::to_string(stride) + " over " + std::to_string(hosts) +
                                             " hosts would put two on one host (at most " + std::to_string(distinct) + ")"};
  }
  return Status::ok();
}

std::vector<int> HostPlacement::holders(int rank) const {
  std::vector<int> out;
  const int own = host_of(rank) % hosts;
  for (int i = 0; i < replicas; ++i) out.push_back((own + i * stride) % hosts);
  return out;
}

std::vector<int> HostPlacement::read_order(const std::string& path) const {
  std::vector<int> order;
  const int rank = data_file_rank(path);
  if (rank >= 0) order = holders(rank);
  for (int host = 0; host < hosts; ++host) {
    if (std::find(order.begin(), order.end(), host) == order.end()) order.push_back(host);
  }
  return order;
}

std::string HostPlacement::on_host(const std::string& path, int host) const {
  std::string out = path;
  const std::string placeholder = kHostPlaceholder;
  for (std::size_t at = out.find(placeholder); at != std::string::npos; at = out.find(placeholder, at)) {
    const std::string number = std::to_string(host);
    out.replace(at, placeholder.size(), number);
    at += number.size();
  }
  return out;
}

std::string HostPlacement::disk(int host) const {
  const std::size_t at = pattern.find(kHostPlaceholder);
  const std::size_t slash = at == std::string::npos ? std::string::npos : pattern.find('/', at);
  return on_host(slash == std::string::npos ? pattern : pattern.substr(0, slash), host);
}

HostPlacement host_placement(const std::string& pattern, int world_size, int ranks_per_host, int replicas,
                             int stride) {
  HostPlacement p;
  p.pattern = pattern;
  p.ranks_per_host = ranks_per_host > 0 ? ranks_per_host : std::max(1, world_size);
  p.hosts = std::max(1, (world_size + p.ranks_per_host - 1) / p.ranks_per_host);
  p.replicas = replicas;
  p.stride = stride;
  return p;
}

int data_file_rank(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return -1;
  const std::string name = path.substr(slash + 1);
  const std::string folder = "/" + std::string(kPolicyDir);
  if (slash < folder.size() || path.compare(slash - folder.size(), folder.size(), folder) != 0) {
    return -1;
  }
  const std::string suffix = ".safetensors";
  if (!name.starts_with("__") || !name.ends_with(suffix)) return -1;
  const std::string middle = name.substr(2, name.size() - 2 - suffix.size());
  const std::size_t underscore = middle.find('_');
  if (underscore == 0 || underscore == std::string::npos || underscore + 1 == middle.size()) return -1;
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::string rank = middle.substr(0, underscore);
  if (!digits(rank) || !digits(middle.substr(underscore + 1))) return -1;
  return std::atoi(rank.c_str());
}

namespace {

/// One file written to several hosts at once.
class TeeFile final : public WritableFile {
 public:
  explicit TeeFile(std::vector<std::unique_ptr<WritableFile>> outs) : outs_(std::move(outs)) {}
  Status append(const void* data, std::size_t bytes) override {
    return each([&](WritableFile& f) { return f.append(data, bytes); });
  }
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    return each([&](WritableFile& f) { return f.write_at(offset, data, bytes); });
  }
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    return each([&](WritableFile& f) { return f.start_writeback(offset, bytes); });
  }
  /// The one copy's memory; none where there are several (bytes copied there would reach one).
  std::uint8_t* memory_at(std::uint64_t offset, std::size_t bytes) override {
    return outs_.size() == 1 ? outs_.front()->memory_at(offset, bytes) : nullptr;
  }
  Status sync() override {
    return each([&](WritableFile& f) { return f.sync(); });
  }
  /// Closes every copy, the first error winning.
  Status close() override {
    Status first;
    for (auto& f : outs_) {
      Status st = f->close();
      if (first.is_ok() && !st.is_ok()) first = std::move(st);
    }
    return first;
  }

 private:
  template <typename F>
  Status each(F&& f) {
    for (auto& out : outs_) SH_RETURN_IF_ERROR(f(*out));
    return Status::ok();
  }
  std::vector<std::unique_ptr<WritableFile>> outs_;
};

/// The locks of every host's folder, released together.
class HostLocks final : public FileLock {
 public:
  std::vector<std::unique_ptr<FileLock>> locks;
};

class HostFoldersFileSystem final : public FileSystem {
 public:
  HostFoldersFileSystem(std::shared_ptr<FileSystem> inner, HostPlacement placement)
      : inner_(std::move(inner)), placement_(std::move(placement)) {}

  const HostPlacement& placement() const { return placement_; }
  FileSystem& inner() const { return *inner_; }

  FileSystemCapabilities capabilities(const std::string& path) const override {
    FileSystemCapabilities capabilities = inner_->capabilities(covers(path) ? placement_.on_host(path, 0) : path);
    // A data file written to several hosts at once has no one memory to lend.
    if (covers(path) && placement_.replicas > 1) capabilities.in_memory = false;
    // A path is read from whichever host holds it: reads are cheap only where every host's are
    // (a disk reached through another host's file server is not).
    if (covers(path)) {
      for (int h = 1; h < placement_.hosts && capabilities.cheap_reads; ++h) {
        capabilities.cheap_reads = inner_->capabilities(placement_.on_host(path, h)).cheap_reads;
      }
    }
    return capabilities;
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    if (!covers(path)) return inner_->create_file(path);
    const int rank = data_file_rank(path);
    std::vector<std::unique_ptr<WritableFile>> outs;
    for (int host : rank >= 0 ? placement_.holders(rank) : every_host()) {
      SH_ASSIGN_OR_RETURN(auto out, inner_->create_file(placement_.on_host(path, host)));
      outs.push_back(std::move(out));
    }
    return std::unique_ptr<WritableFile>(new TeeFile(std::move(outs)));
  }

  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    return covers(path) ? create_file(path) : inner_->create_file_uncached(path);
  }

  Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) override {
    return covers(path) ? open_file(path) : inner_->open_file_uncached(path);
  }

  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    if (!covers(path)) return inner_->open_file(path);
    if (path.ends_with(std::string("/") + kTrackerFile)) return open_tracker(path);
    Status first_error;
    for (int host : placement_.read_order(path)) {
      auto file = inner_->open_file(placement_.on_host(path, host));
      if (file.is_ok()) return file;
      if (file.status().code() != ErrorCode::not_found && first_error.is_ok()) first_error = file.status();
    }
    if (!first_error.is_ok()) return first_error;
    return Status{ErrorCode::not_found, "'" + path + "' is in no host's folder (" + hosts_named() + ")"};
  }

  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    if (!covers(path)) return inner_->stat_file(path);
    Status first_error;
    for (int host : placement_.read_order(path)) {
      auto version = inner_->stat_file(placement_.on_host(path, host));
      if (version.is_ok() && *version) return version;
      if (!version.is_ok() && first_error.is_ok()) first_error = version.status();
    }
    if (!first_error.is_ok()) return first_error;
    return std::optional<FileVersion>{};
  }

  Status remove_file(const std::string& path) override {
    if (!covers(path)) return inner_->remove_file(path);
    return in_every_host(path, [&](const std::string& p) { return inner_->remove_file(p); });
  }

  /// Creates the folder in every host's folder, with the parents a lost host's folder lacks
  /// (below the host's own folder, which must exist).
  Status create_dir(const std::string& path) override {
    if (!covers(path)) return inner_->create_dir(path);
    return in_every_host(path, [&](const std::string& p) { return create_dirs(*inner_, p); });
  }

  /// Whether any host has the folder; a host whose folder cannot be read counts as not having
  /// it while another answers.
  Result<bool> is_dir(const std::string& path) override {
    if (!covers(path)) return inner_->is_dir(path);
    Status first_error;
    bool answered = false;
    for (int host : every_host()) {
      auto dir = inner_->is_dir(placement_.on_host(path, host));
      if (dir.is_ok() && *dir) return true;
      if (dir.is_ok()) answered = true;
      if (!dir.is_ok() && first_error.is_ok()) first_error = dir.status();
    }
    if (!answered && !first_error.is_ok()) return first_error;
    return false;
  }

  /// What any host's folder holds; a host whose folder cannot be read is left out while another
  /// answers.
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    if (!covers(path)) return inner_->list_dir(path);
    std::map<std::string, bool> names;
    Status first_error;
    bool answered = false;
    for (int host : every_host()) {
      auto entries = inner_->list_dir(placement_.on_host(path, host));
      if (!entries.is_ok()) {
        if (first_error.is_ok()) first_error = entries.status();
        continue;
      }
      answered = true;
      for (const auto& e : *entries) names.emplace(e.name, e.is_dir);
    }
    if (!answered) return first_error;
    std::vector<DirEntry> out;
    for (const auto& [name, dir] : names) out.push_back({name, dir});
    return out;
  }

  Status remove_tree(const std::string& path) override {
    if (!covers(path)) return inner_->remove_tree(path);
    return in_every_host(path, [&](const std::string& p) { return inner_->remove_tree(p); });
  }

  /// Syncs the folder in every host: one that a host lacks is an error, as on one disk (a save
  /// whose write folder vanished from a host does not commit).
  Status sync_dir(const std::string& path) override {
    if (!covers(path)) return inner_->sync_dir(path);
    return in_every_host(path, [&](const std::string& p) { return inner_->sync_dir(p); });
  }

  /// Renames in every host's folder that has `from`; not_found when none has it.
  Status rename(const std::string& from, const std::string& to) override {
    if (!covers(from) && !covers(to)) return inner_->rename(from, to);
    SH_RETURN_IF_ERROR(both_covered(from, to));
    bool any = false;
    for (int host : every_host()) {
      const std::string a = placement_.on_host(from, host);
      SH_ASSIGN_OR_RETURN(bool there, exists(a));
      if (!there) continue;
      SH_RETURN_IF_ERROR(inner_->rename(a, placement_.on_host(to, host)));
      any = true;
    }
    if (any) return Status::ok();
    return Status{ErrorCode::not_found, "cannot rename '" + from + "': it is in no host's folder (" + hosts_named() + ")"};
  }

  /// Swaps in every host's folder that has both; where only `a` is there (a host's folder that
  /// lost `b`) `a` is renamed to `b`.
  Status exchange(const std::string& a, const std::string& b) override {
    if (!covers(a) && !covers(b)) return inner_->exchange(a, b);
    SH_RETURN_IF_ERROR(both_covered(a, b));
    bool any = false;
    for (int host : every_host()) {
      const std::string ha = placement_.on_host(a, host);
      const std::string hb = placement_.on_host(b, host);
      SH_ASSIGN_OR_RETURN(bool has_a, exists(ha));
      if (!has_a) continue;
      SH_ASSIGN_OR_RETURN(bool has_b, exists(hb));
      SH_RETURN_IF_ERROR(has_b ? inner_->exchange(ha, hb) : inner_->rename(ha, hb));
      any = true;
    }
    if (any) return Status::ok();
    return Status{ErrorCode::not_found, "cannot exchange '" + a + "': it is in no host's folder (" + hosts_named() + ")"};
  }

  /// Every host's folder can be written: the folder itself, or, where it is not there yet (a
  /// replaced host), its host's own folder, which must exist.
  Status check_access(const std::string& path) override {
    if (!covers(path)) return inner_->check_access(path);
    for (int host : every_host()) {
      SH_RETURN_IF_ERROR(check_mounted(host));
      const std::string p = placement_.on_host(path, host);
      SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(p));
      SH_RETURN_IF_ERROR(inner_->check_access(dir ? p : placement_.disk(host)));
    }
    return Status::ok();
  }

  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, const std::string& holder) override {
    if (!covers(path)) return inner_->lock_file(path, holder);
    auto locks = std::make_unique<HostLocks>();
    for (int host : every_host()) {
      const std::string p = placement_.on_host(path, host);
      SH_RETURN_IF_ERROR(check_mounted(host));
      SH_RETURN_IF_ERROR(create_dirs(*inner_, parent_path(p)));
      SH_ASSIGN_OR_RETURN(auto lock, inner_->lock_file(p, holder));
      locks->locks.push_back(std::move(lock));
    }
    return std::unique_ptr<FileLock>(std::move(locks));
  }

  Result<int> abort_unfinished_writes(const std::string& path) override {
    if (!covers(path)) return inner_->abort_unfinished_writes(path);
    int total = 0;
    for (int host : every_host()) {
      SH_ASSIGN_OR_RETURN(int n, inner_->abort_unfinished_writes(placement_.on_host(path, host)));
      total += n;
    }
    return total;
  }

  /// An error naming host `host`'s own folder when it does not exist (its disk not mounted):
  /// nothing is made below a folder that should be a disk.
  Status check_mounted(int host) {
    const std::string mount = placement_.disk(host);
    SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(mount));
    if (dir) return Status::ok();
    return Status{ErrorCode::not_found, "host " + std::to_string(host) + "'s folder '" + mount + "' of '" +
                                            placement_.pattern + "' does not exist (is its disk mounted?)"};
  }

 private:
  bool covers(const std::string& path) const { return path.find(kHostPlaceholder) != std::string::npos; }

  Status both_covered(const std::string& a, const std::string& b) const {
    if (covers(a) && covers(b)) return Status::ok();
    return Status{ErrorCode::invalid_argument, "cannot move '" + a + "' to '" + b + "': one is in the host folders of '" +
                                                   placement_.pattern + "' and the other not"};
  }

  std::vector<int> every_host() const {
    std::vector<int> out(static_cast<std::size_t>(placement_.hosts));
    std::iota(out.begin(), out.end(), 0);
    return out;
  }

  std::string hosts_named() const {
    return "hosts 0 to " + std::to_string(placement_.hosts - 1) + " of '" + placement_.pattern + "'";
  }

  /// Whether a file or a folder is at `p`.
  Result<bool> exists(const std::string& p) {
    SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(p));
    if (dir) return true;
    return file_exists(*inner_, p);
  }

  /// The tracker of the first host whose copy parses (hosts are written in order, so a commit
  /// cut between two hosts leaves the newest in the first; a rollback's lower step is as new).
  /// A copy that does not parse (torn, or damaged) is passed over for the next host's.
  Result<std::unique_ptr<ReadableFile>> open_tracker(const std::string& path) {
    Status first_error;
    int fallback = -1;
    for (int host : every_host()) {
      const std::string p = placement_.on_host(path, host);
      auto text = read_small_file(*inner_, p);
      if (!text.is_ok()) {
        if (first_error.is_ok()) first_error = text.status();
        continue;
      }
      if (!*text) continue;
      if (parse_tracker(**text, p).is_ok()) return inner_->open_file(p);
      if (fallback < 0) fallback = host;
    }
    // None parses: the first one's error is what the reader reports.
    if (fallback >= 0) return inner_->open_file(placement_.on_host(path, fallback));
    if (!first_error.is_ok()) return first_error;
    return Status{ErrorCode::not_found, "'" + path + "' is in no host's folder (" + hosts_named() + ")"};
  }

  /// `f` on `path` in every host, in host order; the host's own folder must exist.
  template <typename F>
  Status in_every_host(const std::string& path, F&& f) {
    for (int host : every_host()) {
      SH_RETURN_IF_ERROR(check_mounted(host));
      SH_RETURN_IF_ERROR(f(placement_.on_host(path, host)));
    }
    return Status::ok();
  }

  std::shared_ptr<FileSystem> inner_;
  HostPlacement placement_;
};

}  // namespace

Result<std::shared_ptr<FileSystem>> host_folders_file_system(std::shared_ptr<FileSystem> inner, HostPlacement placement) {
  SH_RETURN_IF_ERROR(placement.check());
  return std::shared_ptr<FileSystem>(std::make_shared<HostFoldersFileSystem>(std::move(inner), std::move(placement)));
}

const HostPlacement* host_placement_of(const FileSystem& fs) {
  const auto* folders = dynamic_cast<const HostFoldersFileSystem*>(&fs);
  return folders ? &folders->placement() : nullptr;
}

FileSystem* host_folders_inner(FileSystem& fs) {
  auto* folders = dynamic_cast<HostFoldersFileSystem*>(&fs);
  return folders ? &folders->inner() : nullptr;
}

}  // namespace stagehand
