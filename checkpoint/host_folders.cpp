#include "stagehand/checkpoint/host_folders.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>

#include "stagehand/checkpoint/checkpoint_reader.hpp"
#include "stagehand/checkpoint/layout.hpp"
#include "stagehand/checkpoint/metadata.hpp"
#include "stagehand/core/xxh3.hpp"

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
    return inner_->capabilities(covers(path) ? placement_.on_host(path, 0) : path);
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

  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    if (!covers(path)) return inner_->open_file(path);
    Status first_error;
    for (int host : read_order(path)) {
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
    for (int host : read_order(path)) {
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

  /// Creates the folder in every host's folder, with the parents a lost host's folder lacks.
  Status create_dir(const std::string& path) override {
    if (!covers(path)) return inner_->create_dir(path);
    return in_every_host(path, [&](const std::string& p) { return create_dirs(*inner_, p); });
  }

  Result<bool> is_dir(const std::string& path) override {
    if (!covers(path)) return inner_->is_dir(path);
    for (int host : every_host()) {
      SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(placement_.on_host(path, host)));
      if (dir) return true;
    }
    return false;
  }

  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    if (!covers(path)) return inner_->list_dir(path);
    std::map<std::string, bool> names;
    for (int host : every_host()) {
      SH_ASSIGN_OR_RETURN(auto entries, inner_->list_dir(placement_.on_host(path, host)));
      for (const auto& e : entries) names.emplace(e.name, e.is_dir);
    }
    std::vector<DirEntry> out;
    for (const auto& [name, dir] : names) out.push_back({name, dir});
    return out;
  }

  Status remove_tree(const std::string& path) override {
    if (!covers(path)) return inner_->remove_tree(path);
    return in_every_host(path, [&](const std::string& p) { return inner_->remove_tree(p); });
  }

  Status sync_dir(const std::string& path) override {
    if (!covers(path)) return inner_->sync_dir(path);
    return in_every_host(path, [&](const std::string& p) -> Status {
      SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(p));
      return dir ? inner_->sync_dir(p) : Status::ok();
    });
  }

  /// Renames in every host's folder that has `from`; not_found when none has it.
  Status rename(const std::string& from, const std::string& to) override {
    if (!covers(from) && !covers(to)) return inner_->rename(from, to);
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

  /// Every host's folder, or the nearest folder above it that exists (a lost host's folder is
  /// made again when it is written), can be written.
  Status check_access(const std::string& path) override {
    if (!covers(path)) return inner_->check_access(path);
    return in_every_host(path, [&](const std::string& p) -> Status {
      std::string at = p;
      for (;;) {
        SH_ASSIGN_OR_RETURN(bool dir, inner_->is_dir(at));
        if (dir) return inner_->check_access(at);
        const std::string up = parent_path(at);
        if (up == at || up == "." || up.empty()) return inner_->check_access(p);
        at = up;
      }
    });
  }

  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, const std::string& holder) override {
    if (!covers(path)) return inner_->lock_file(path, holder);
    auto locks = std::make_unique<HostLocks>();
    for (int host : every_host()) {
      const std::string p = placement_.on_host(path, host);
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

  /// Where a path's copies are looked for: a data file's holders first, then every other host.
  std::vector<int> read_order(const std::string& path) const {
    const int rank = data_file_rank(path);
    if (rank < 0) return every_host();
    std::vector<int> order = placement_.holders(rank);
    for (int host : every_host()) {
      if (std::find(order.begin(), order.end(), host) == order.end()) order.push_back(host);
    }
    return order;
  }

 private:
  bool covers(const std::string& path) const { return path.find(kHostPlaceholder) != std::string::npos; }

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

  template <typename F>
  Status in_every_host(const std::string& path, F&& f) {
    for (int host : every_host()) SH_RETURN_IF_ERROR(f(placement_.on_host(path, host)));
    return Status::ok();
  }

  std::shared_ptr<FileSystem> inner_;
  HostPlacement placement_;
};

// -- the check before a resume --

constexpr std::size_t kPieceBytes = std::size_t{8} << 20;

std::string describe(const FileMeta& meta) {
  return std::to_string(meta.size) + " bytes, XXH3 " + xxh3_hex(meta.xxh3);
}

/// Whether the copy at `path` holds what `meta` records: ok, not_found when there is none, or
/// corruption saying what differs.
Status verify_copy(FileSystem& fs, const std::string& path, const FileMeta& meta, std::vector<char>& buffer) {
  SH_ASSIGN_OR_RETURN(auto in, fs.open_file(path));
  if (in->size() != meta.size) {
    return {ErrorCode::corruption, "holds " + std::to_string(in->size()) + " bytes where the metadata records " + describe(meta)};
  }
  Xxh3Stream hash;
  for (std::uint64_t offset = 0; offset < meta.size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), meta.size - offset));
    SH_RETURN_IF_ERROR(in->read(offset, buffer.data(), n));
    hash.update(buffer.data(), n);
    offset += n;
  }
  if (hash.digest() != meta.xxh3) {
    return {ErrorCode::corruption, "has XXH3 " + xxh3_hex(hash.digest()) + " where the metadata records " + describe(meta)};
  }
  return Status::ok();
}

/// Rewrites `to` from the verified copy `from` (beside it, then renamed over it) and reads it back.
Status restore_copy(FileSystem& fs, const std::string& from, const std::string& to, const FileMeta& meta,
                    std::vector<char>& buffer) {
  SH_ASSIGN_OR_RETURN(auto in, fs.open_file(from));
  auto fill = [&](WritableFile& out) -> Status {
    for (std::uint64_t offset = 0; offset < meta.size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), meta.size - offset));
      SH_RETURN_IF_ERROR(in->read(offset, buffer.data(), n));
      SH_RETURN_IF_ERROR(out.append(buffer.data(), n));
      offset += n;
    }
    return Status::ok();
  };
  SH_RETURN_IF_ERROR(write_file_atomic(fs, to, fill));
  Status back = verify_copy(fs, to, meta, buffer);
  if (!back.is_ok()) return back.with_context("'" + to + "' after it was restored from '" + from + "'");
  return Status::ok();
}

}  // namespace

std::shared_ptr<FileSystem> host_folders_file_system(std::shared_ptr<FileSystem> inner, HostPlacement placement) {
  return std::make_shared<HostFoldersFileSystem>(std::move(inner), std::move(placement));
}

const HostPlacement* host_placement_of(const FileSystem& fs) {
  const auto* folders = dynamic_cast<const HostFoldersFileSystem*>(&fs);
  return folders ? &folders->placement() : nullptr;
}

Result<HostCheckReport> check_host_copies(FileSystem& fs, const std::string& checkpoint_dir) {
  auto* folders = dynamic_cast<HostFoldersFileSystem*>(&fs);
  if (!folders || checkpoint_dir.find(kHostPlaceholder) == std::string::npos) {
    return Status{ErrorCode::invalid_argument, "'" + checkpoint_dir + "' is not in host folders"};
  }
  const HostPlacement& placement = folders->placement();
  FileSystem& inner = folders->inner();
  HostCheckReport report;
  // The hosts whose folder holds the step (a lost host's does not).
  std::vector<bool> holds(static_cast<std::size_t>(placement.hosts), false);
  for (int host = 0; host < placement.hosts; ++host) {
    SH_ASSIGN_OR_RETURN(bool dir, inner.is_dir(placement.on_host(checkpoint_dir, host)));
    holds[static_cast<std::size_t>(host)] = dir;
  }
  auto host_name = [](int host) { return "host " + std::to_string(host); };
  // metadata.json: the first copy that checks, written again over the copies that do not.
  std::string text;
  std::optional<CheckpointMetadata> metadata;
  std::vector<std::string> metadata_faults;
  std::vector<int> bad_metadata;
  int metadata_host = -1;
  for (int host = 0; host < placement.hosts; ++host) {
    if (!holds[static_cast<std::size_t>(host)]) continue;
    std::string read;
    auto m = read_checkpoint_metadata(inner, placement.on_host(checkpoint_dir, host), &read);
    if (!m.is_ok()) {
      metadata_faults.push_back(host_name(host) + ": " + m.status().message());
      bad_metadata.push_back(host);
      continue;
    }
    if (!metadata) {
      metadata = std::move(*m);
      text = std::move(read);
      metadata_host = host;
    } else if (read != text) {
      // A copy of another save of this step: the first one's files are what is checked.
      metadata_faults.push_back(host_name(host) + ": differs from " + host_name(metadata_host) + "'s");
      bad_metadata.push_back(host);
    }
  }
  if (!metadata) {
    std::string why;
    for (const auto& f : metadata_faults) why += (why.empty() ? "" : "; ") + f;
    return Status{ErrorCode::corruption, "no host's copy of " + std::string(kMetadataFile) + " of '" + checkpoint_dir +
                                             "' checks (" + (why.empty() ? "no host's folder holds the step" : why) + ")"};
  }
  for (int host : bad_metadata) {
    const std::string path = CheckpointLayout::policy_dir(placement.on_host(checkpoint_dir, host)) + "/" + kMetadataFile;
    SH_RETURN_IF_ERROR(write_file_atomic(inner, path, text).with_context("restoring " + host_name(host) + "'s " + kMetadataFile));
    report.repaired.push_back(host_name(host) + "'s copy of " + std::string(kMetadataFile));
  }
  // Every other file: the first copy in read order that verifies; the damaged or missing copies
  // before it, in host folders that hold the step, restored from it.
  struct Wanted {
    std::string path;  // with the placeholder
    FileMeta meta;
    int rank;  // -1: not a data file
  };
  std::vector<Wanted> wanted;
  const std::string policy = CheckpointLayout::policy_dir(checkpoint_dir);
  for (const auto& [name, meta] : metadata->files) wanted.push_back({policy + "/" + name, meta, data_file_rank(policy + "/" + name)});
  if (metadata->trainer_state) wanted.push_back({checkpoint_dir + "/" + kTrainerStateFile, *metadata->trainer_state, -1});
  std::vector<char> buffer(kPieceBytes);
  std::vector<std::string> lost;
  for (const Wanted& w : wanted) {
    const std::string name = w.path.substr(w.path.rfind('/') + 1);
    const std::string what = w.rank >= 0 ? "rank " + std::to_string(w.rank) + "'s part '" + name + "'" : "'" + name + "'";
    const std::vector<int> order = folders->read_order(w.path);
    std::vector<std::string> faults;
    std::vector<int> to_restore;
    int good = -1;
    for (int host : order) {
      const std::string path = placement.on_host(w.path, host);
      if (!holds[static_cast<std::size_t>(host)]) {
        faults.push_back(host_name(host) + " has none (its folder lacks the step)");
        continue;
      }
      Status st = verify_copy(inner, path, w.meta, buffer);
      if (st.is_ok()) {
        good = host;
        break;
      }
      if (st.code() != ErrorCode::not_found && st.code() != ErrorCode::corruption) return st;
      faults.push_back(st.code() == ErrorCode::not_found ? host_name(host) + " has none" : host_name(host) + "'s copy " + st.message());
      to_restore.push_back(host);
    }
    if (good < 0) {
      std::string why;
      for (const auto& f : faults) why += (why.empty() ? "" : ", ") + f;
      lost.push_back(what + ": " + why + (w.rank >= 0 ? "; no replica verifies" : "; no host's copy verifies"));
      continue;
    }
    const std::string source = placement.on_host(w.path, good);
    for (std::size_t i = 0; i < to_restore.size(); ++i) {
      const int host = to_restore[i];
      SH_RETURN_IF_ERROR(restore_copy(inner, source, placement.on_host(w.path, host), w.meta, buffer));
      report.repaired.push_back(host_name(host) + "'s copy of " + what + " from " + host_name(good));
    }
    if (good != order.front() && !holds[static_cast<std::size_t>(order.front())]) {
      report.from_replicas.push_back(what + " from " + host_name(good) + " (" + host_name(order.front()) +
                                     "'s folder lacks the step)");
    }
  }
  if (!lost.empty()) {
    std::string why;
    for (std::size_t i = 0; i < lost.size() && i < 4; ++i) why += (i ? "; " : "") + lost[i];
    if (lost.size() > 4) why += "; and " + std::to_string(lost.size() - 4) + " more file(s)";
    return Status{ErrorCode::corruption, why};
  }
  return report;
}

}  // namespace stagehand
