#include "stagehand/checkpoint/host_folders.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "stagehand/checkpoint/checkpoint_reader.hpp"
#include "stagehand/checkpoint/checkpoint_store.hpp"
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
      : inner_(std::move(inner)), placement_(std::move(placement)) {
    // The folder of each host that must exist (its disk), the one whose name holds the
    // placeholder: what is below it is made as needed, it never is.
    const std::size_t at = placement_.pattern.find(kHostPlaceholder);
    const std::size_t slash = placement_.pattern.find('/', at);
    mount_ = slash == std::string::npos ? placement_.pattern : placement_.pattern.substr(0, slash);
  }

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
    if (path.ends_with(std::string("/") + kTrackerFile)) return open_tracker(path);
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
      SH_RETURN_IF_ERROR(inner_->check_access(dir ? p : placement_.on_host(mount_, host)));
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

  /// An error naming host `host`'s own folder when it does not exist (its disk not mounted):
  /// nothing is made below a folder that should be a disk.
  Status check_mounted(int host) {
    const std::string mount = placement_.on_host(mount_, host);
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

  /// The tracker naming the newest step of any host's copy (a host that missed the last commits,
  /// or a commit cut between two hosts' trackers, names an older one); a copy that does not
  /// parse is passed over while another does.
  Result<std::unique_ptr<ReadableFile>> open_tracker(const std::string& path) {
    int best = -1;
    std::int64_t best_step = -1;
    for (int host : every_host()) {
      auto text = read_small_file(*inner_, placement_.on_host(path, host));
      if (!text.is_ok() || !*text) continue;
      auto step = parse_tracker(**text, placement_.on_host(path, host));
      if (step.is_ok() && *step > best_step) {
        best_step = *step;
        best = host;
      }
    }
    if (best >= 0) return inner_->open_file(placement_.on_host(path, best));
    Status first_error;
    for (int host : every_host()) {
      auto file = inner_->open_file(placement_.on_host(path, host));
      if (file.is_ok()) return file;
      if (file.status().code() != ErrorCode::not_found && first_error.is_ok()) first_error = file.status();
    }
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
  std::string mount_;
};

// -- the check before a resume --

constexpr std::size_t kPieceBytes = std::size_t{8} << 20;

std::string describe(const FileMeta& meta) {
  return std::to_string(meta.size) + " bytes, XXH3 " + xxh3_hex(meta.xxh3);
}

/// Whether the copy at `path` holds what `meta` records: ok, not_found when there is none, or
/// another error saying what differs (corruption) or why it cannot be read.
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
  SH_RETURN_IF_ERROR(create_dirs(fs, parent_path(to)));
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

std::string host_name(int host) { return "host " + std::to_string(host); }

/// One file of the step, as the check found it.
struct Examined {
  std::string path;  // with the placeholder
  std::string what;  // "rank 1's part '__1_0.safetensors'"
  FileMeta meta;
  /// The first copy in read order that verifies; -1: none.
  int good = -1;
  /// What was wrong with each copy read before it.
  std::vector<std::string> faults;
  /// Copies to write again from the good one: damaged ones read before it (`in_the_way`: reads
  /// would take them) and missing ones, and holders' copies after it that are missing or of the
  /// wrong size.
  struct Restore {
    int host;
    bool in_the_way;
  };
  std::vector<Restore> restore;
  /// The first copy in read order is on a host whose folder lacks the step.
  bool own_lost = false;
};

/// Reads every copy of `file` in read order until one verifies, then checks the sizes of the
/// remaining holders' copies.
Examined examine(HostFoldersFileSystem& folders, const std::vector<int>& order, const std::vector<int>& holders,
                 const std::vector<std::string>& unreadable, Examined file, std::vector<char>& buffer) {
  const HostPlacement& placement = folders.placement();
  FileSystem& inner = folders.inner();
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int host = order[i];
    if (!unreadable[static_cast<std::size_t>(host)].empty()) {
      file.faults.push_back(unreadable[static_cast<std::size_t>(host)]);
      if (i == 0) file.own_lost = true;
      continue;
    }
    Status st = verify_copy(inner, placement.on_host(file.path, host), file.meta, buffer);
    if (st.is_ok()) {
      file.good = host;
      // The holders' copies after it: missing or of another size, written again.
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        const int later = order[j];
        if (std::find(holders.begin(), holders.end(), later) == holders.end()) continue;
        if (!unreadable[static_cast<std::size_t>(later)].empty()) continue;
        auto version = inner.stat_file(placement.on_host(file.path, later));
        if (!version.is_ok() || !*version || (*version)->size != file.meta.size) file.restore.push_back({later, false});
      }
      return file;
    }
    const bool missing = st.code() == ErrorCode::not_found;
    file.faults.push_back(missing ? host_name(host) + " has none" : host_name(host) + "'s copy " + st.message());
    file.restore.push_back({host, !missing});
  }
  return file;
}

}  // namespace

Result<std::shared_ptr<FileSystem>> host_folders_file_system(std::shared_ptr<FileSystem> inner, HostPlacement placement) {
  SH_RETURN_IF_ERROR(placement.check());
  return std::shared_ptr<FileSystem>(std::make_shared<HostFoldersFileSystem>(std::move(inner), std::move(placement)));
}

Status keep_host_record(FileSystem& fs, const std::string& root) {
  const HostPlacement* placement = host_placement_of(fs);
  if (!placement || root.find(kHostPlaceholder) == std::string::npos) {
    return Status{ErrorCode::invalid_argument, "'" + root + "' is not in host folders"};
  }
  const std::string path = root + "/" + kHostRecordFile;
  auto describe_placement = [](std::int64_t hosts, std::int64_t per, std::int64_t replicas, std::int64_t stride) {
    return std::to_string(hosts) + " host folders (" + std::to_string(per) + " ranks per host, " +
           std::to_string(replicas) + " copies of each rank's files, stride " + std::to_string(stride) + ")";
  };
  const std::string now = describe_placement(placement->hosts, placement->ranks_per_host, placement->replicas, placement->stride);
  SH_ASSIGN_OR_RETURN(auto text, read_small_file(fs, path));
  if (text) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("hosts") || !j["hosts"].is_number_integer()) {
      return Status{ErrorCode::corruption, "'" + path + "' does not say how many hosts wrote the local tier"};
    }
    const std::int64_t hosts = j["hosts"].get<std::int64_t>();
    auto field = [&](const char* key) { return j.contains(key) && j[key].is_number_integer() ? j[key].get<std::int64_t>() : 0; };
    if (hosts > placement->hosts) {
      return Status{ErrorCode::invalid_argument,
                    "'" + root + "' was written by " + describe_placement(hosts, field("ranks_per_host"), field("replicas"), field("stride")) +
                        "; this run has " + now + ": the folders of hosts " + std::to_string(placement->hosts) + " to " +
                        std::to_string(hosts - 1) + " would never be read. Keep the world size and trainer.ranks_per_host, "
                        "or move the local tier away to resume from the durable tier"};
    }
    if (hosts == placement->hosts) return Status::ok();
  }
  const nlohmann::json record{{"hosts", placement->hosts},
                              {"ranks_per_host", placement->ranks_per_host},
                              {"replicas", placement->replicas},
                              {"stride", placement->stride}};
  // In every host's folder (the decorator makes what a host's folder lacks).
  SH_RETURN_IF_ERROR(fs.create_dir(root));
  return write_file_atomic(fs, path, record.dump() + "\n");
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
  std::vector<int> every(static_cast<std::size_t>(placement.hosts));
  std::iota(every.begin(), every.end(), 0);
  // Why each host's folder offers no copy: it lacks the step (a lost host), or cannot be read.
  std::vector<std::string> unreadable(every.size());
  std::vector<std::string> offers_none(every.size());
  for (int host : every) {
    auto dir = inner.is_dir(placement.on_host(checkpoint_dir, host));
    if (!dir.is_ok()) {
      offers_none[static_cast<std::size_t>(host)] = host_name(host) + "'s folder cannot be read (" + dir.status().message() + ")";
      unreadable[static_cast<std::size_t>(host)] = offers_none[static_cast<std::size_t>(host)];
    } else if (!*dir) {
      offers_none[static_cast<std::size_t>(host)] = host_name(host) + "'s folder lacks the step";
      unreadable[static_cast<std::size_t>(host)] = host_name(host) + " has none (its folder lacks the step)";
    }
  }
  // metadata.json: each distinct text that checks is a candidate, in host order (two differ
  // after a commit cut between hosts, or a host that missed commits); the first whose files all
  // have a good copy is the step.
  struct Version {
    std::string text;
    CheckpointMetadata metadata;
  };
  std::vector<Version> versions;
  std::vector<std::string> metadata_faults;
  for (int host : every) {
    if (!unreadable[static_cast<std::size_t>(host)].empty()) continue;
    std::string text;
    auto m = read_checkpoint_metadata(inner, placement.on_host(checkpoint_dir, host), &text);
    if (!m.is_ok()) {
      metadata_faults.push_back(host_name(host) + ": " + m.status().message());
      continue;
    }
    if (std::none_of(versions.begin(), versions.end(), [&](const Version& v) { return v.text == text; })) {
      versions.push_back({std::move(text), std::move(*m)});
    }
  }
  if (versions.empty()) {
    std::string why;
    for (const auto& f : metadata_faults) why += (why.empty() ? "" : "; ") + f;
    return Status{ErrorCode::corruption, "no host's copy of " + std::string(kMetadataFile) + " of '" + checkpoint_dir +
                                             "' checks (" + (why.empty() ? "no host's folder holds the step" : why) + ")"};
  }
  std::vector<char> buffer(kPieceBytes);
  const std::string policy = CheckpointLayout::policy_dir(checkpoint_dir);
  std::vector<Examined> chosen;
  const Version* version = nullptr;
  std::vector<std::string> first_lost;
  for (const Version& v : versions) {
    std::vector<Examined> files;
    std::vector<std::string> lost;
    auto look = [&](const std::string& path, const FileMeta& meta) {
      const int rank = data_file_rank(path);
      const std::string name = path.substr(path.rfind('/') + 1);
      Examined e;
      e.path = path;
      e.meta = meta;
      e.what = rank >= 0 ? "rank " + std::to_string(rank) + "'s part '" + name + "'" : "'" + name + "'";
      e = examine(*folders, folders->read_order(path), rank >= 0 ? placement.holders(rank) : every, unreadable,
                  std::move(e), buffer);
      if (e.good < 0) {
        std::string why;
        for (const auto& f : e.faults) why += (why.empty() ? "" : ", ") + f;
        lost.push_back(e.what + ": " + why + (rank >= 0 ? "; no replica verifies" : "; no host's copy verifies"));
      }
      files.push_back(std::move(e));
    };
    for (const auto& [name, meta] : v.metadata.files) look(policy + "/" + name, meta);
    if (v.metadata.trainer_state) look(checkpoint_dir + "/" + kTrainerStateFile, *v.metadata.trainer_state);
    if (lost.empty()) {
      chosen = std::move(files);
      version = &v;
      break;
    }
    if (first_lost.empty()) first_lost = std::move(lost);
  }
  if (!version) {
    std::string why;
    for (std::size_t i = 0; i < first_lost.size() && i < 4; ++i) why += (i ? "; " : "") + first_lost[i];
    if (first_lost.size() > 4) why += "; and " + std::to_string(first_lost.size() - 4) + " more file(s)";
    if (versions.size() > 1) {
      why += " (nor do the files of the " + std::to_string(versions.size() - 1) + " other version(s) of " +
             kMetadataFile + " the hosts hold)";
    }
    return Status{ErrorCode::corruption, why};
  }
  // The step verifies: copies that reads would take before a good one, missing ones and
  // under-sized replicas are written again from it; then metadata.json where it differs.
  for (const Examined& e : chosen) {
    const std::string source = placement.on_host(e.path, e.good);
    for (const auto& r : e.restore) {
      Status st = restore_copy(inner, source, placement.on_host(e.path, r.host), e.meta, buffer);
      const std::string what = host_name(r.host) + "'s copy of " + e.what;
      if (st.is_ok()) {
        report.repaired.push_back(what + " from " + host_name(e.good));
        continue;
      }
      // A damaged copy that stays is what reads would take.
      if (r.in_the_way) {
        return Status{ErrorCode::corruption, e.what + ": " + host_name(r.host) +
                                                 "'s copy is damaged and could not be rewritten from " +
                                                 host_name(e.good) + "'s (" + st.message() + ")"};
      }
      report.unrepaired.push_back(what + " (" + st.message() + ")");
    }
    if (e.own_lost && e.good >= 0) {
      const int own = folders->read_order(e.path).front();
      report.from_replicas.push_back(e.what + " from " + host_name(e.good) + " (" + offers_none[static_cast<std::size_t>(own)] + ")");
    }
  }
  for (int host : every) {
    if (!unreadable[static_cast<std::size_t>(host)].empty()) continue;
    const std::string path = CheckpointLayout::policy_dir(placement.on_host(checkpoint_dir, host)) + "/" + kMetadataFile;
    auto text = read_small_file(inner, path);
    if (text.is_ok() && *text && **text == version->text) continue;
    const std::string why = !text.is_ok() ? text.status().message() : !*text ? "missing" : "damaged or of another save";
    Status st = write_file_atomic(inner, path, version->text);
    if (!st.is_ok()) {
      return Status{ErrorCode::corruption, host_name(host) + "'s " + kMetadataFile + " (" + why +
                                               ") could not be rewritten: " + st.message()};
    }
    report.repaired.push_back(host_name(host) + "'s copy of " + std::string(kMetadataFile) + " (" + why + ")");
  }
  return report;
}

}  // namespace stagehand
