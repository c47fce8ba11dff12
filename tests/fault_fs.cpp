#include "tests/fault_fs.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

namespace stagehand::test {

namespace fs = std::filesystem;

const char* to_string(FsOp op) {
  switch (op) {
    case FsOp::create_file:
      return "create_file";
    case FsOp::append:
      return "append";
    case FsOp::write_at:
      return "write_at";
    case FsOp::sync:
      return "sync";
    case FsOp::close:
      return "close";
    case FsOp::remove_file:
      return "remove_file";
    case FsOp::create_dir:
      return "create_dir";
    case FsOp::remove_tree:
      return "remove_tree";
    case FsOp::sync_dir:
      return "sync_dir";
    case FsOp::rename:
      return "rename";
    case FsOp::exchange:
      return "exchange";
    case FsOp::open_file:
      return "open_file";
    case FsOp::read:
      return "read";
  }
  return "unknown";
}

bool changes_disk(FsOp op) {
  return op <= FsOp::exchange;
}

std::string FsCall::to_string() const {
  std::string text = std::to_string(index) + " " + test::to_string(op) + " '" + path + "'";
  if (!other.empty()) text += " -> '" + other + "'";
  if (op == FsOp::append || op == FsOp::write_at) {
    text += " [" + std::to_string(offset) + ", +" + std::to_string(bytes) + ")";
  }
  if (!status.is_ok()) text += ": " + status.message();
  return text;
}

Result<DiskImage> read_image(const std::string& root) {
  DiskImage image;
  std::error_code ec;
  std::string prefix = root;
  while (prefix.size() > 1 && prefix.back() == '/')
    prefix.pop_back();
  prefix += "/";
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string full = it->path().string();
    const std::string path = full.substr(prefix.size());
    const fs::file_status status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(status)) {
      image[path] = std::nullopt;
    } else if (fs::is_regular_file(status)) {
      std::ifstream in(full, std::ios::binary);
      std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      if (in.bad()) return Status::from_errno(EIO, "read of '" + full + "'");
      image[path] = std::move(bytes);
    } else {
      return Status{ErrorCode::invalid_argument, "'" + full + "' is neither a file nor a folder"};
    }
  }
  if (ec) return Status::from_errno(ec.value(), "cannot list '" + root + "'");
  return image;
}

Status write_image(const std::string& root, const DiskImage& image) {
  // Only what differs is changed: removing and writing files is what costs.
  SH_ASSIGN_OR_RETURN(DiskImage present, read_image(root));
  std::error_code ec;
  std::string removed;
  for (const auto& [path, bytes] : present) {
    if (!removed.empty() && path.starts_with(removed)) continue;
    auto wanted = image.find(path);
    if (wanted != image.end() && wanted->second.has_value() == bytes.has_value()) continue;
    fs::remove_all(root + "/" + path, ec);
    if (ec) return Status::from_errno(ec.value(), "cannot remove '" + root + "/" + path + "'");
    removed = path + "/";
  }
  // A folder's path sorts before those below it.
  for (const auto& [path, bytes] : image) {
    const std::string full = root + "/" + path;
    auto there = present.find(path);
    const bool kept = there != present.end() && there->second.has_value() == bytes.has_value() &&
                      fs::exists(full);
    if (!bytes) {
      if (kept) continue;
      fs::create_directory(full, ec);
      if (ec) return Status::from_errno(ec.value(), "cannot create folder '" + full + "'");
      continue;
    }
    if (kept && *there->second == *bytes) continue;
    std::ofstream out(full, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.close();
    if (!out) return Status::from_errno(EIO, "write to '" + full + "'");
  }
  return Status::ok();
}

// -- the files it opens --

class FaultFileSystem::File final : public WritableFile {
 public:
  File(FaultFileSystem& fs, std::unique_ptr<WritableFile> inner, std::string path,
       std::optional<std::size_t> inode, std::uint64_t epoch)
      : fs_(fs), inner_(std::move(inner)), path_(std::move(path)), inode_(inode), epoch_(epoch) {}

  Status append(const void* data, std::size_t bytes) override {
    return fs_.write(*this, FsOp::append, position_, data, bytes);
  }
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    return fs_.write(*this, FsOp::write_at, offset, data, bytes);
  }
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    return inner_->start_writeback(offset, bytes);
  }
  Status sync() override { return fs_.sync_file(*this); }
  Status close() override { return fs_.close_file(*this); }

 private:
  friend class FaultFileSystem;

  FaultFileSystem& fs_;
  std::unique_ptr<WritableFile> inner_;
  std::string path_;
  /// None outside the modelled folder.
  std::optional<std::size_t> inode_;
  std::uint64_t epoch_;
  /// Where append() writes: the descriptor's offset, which write_at() leaves alone.
  std::uint64_t position_ = 0;
};

class FaultFileSystem::ReadFile final : public ReadableFile {
 public:
  ReadFile(FaultFileSystem& fs, std::unique_ptr<ReadableFile> inner, std::string path)
      : fs_(fs), inner_(std::move(inner)), path_(std::move(path)) {}

  std::uint64_t size() const override { return inner_->size(); }
  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    SH_RETURN_IF_ERROR(fs_.check_read(path_));
    return inner_->read(offset, dst, bytes);
  }
  Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
    SH_RETURN_IF_ERROR(fs_.check_read(path_));
    return inner_->read_vectored(offset, segments);
  }

 private:
  FaultFileSystem& fs_;
  std::unique_ptr<ReadableFile> inner_;
  std::string path_;
};

// -- construction, recording, faults and power --

FaultFileSystem::FaultFileSystem(std::string root, bool real_syncs)
    : FileSystemWrapper(local_file_system()), root_(std::move(root)), real_syncs_(real_syncs) {
  while (root_.size() > 1 && root_.back() == '/')
    root_.pop_back();
}

Result<std::shared_ptr<FaultFileSystem>> FaultFileSystem::create(std::string root,
                                                                 bool real_syncs) {
  std::shared_ptr<FaultFileSystem> fs(new FaultFileSystem(std::move(root), real_syncs));
  SH_RETURN_IF_ERROR(fs->reset());
  return fs;
}

std::vector<FsCall> FaultFileSystem::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

std::size_t FaultFileSystem::call_count() const {
  std::lock_guard lock(mutex_);
  return calls_.size();
}

void FaultFileSystem::inject(FsFault fault) {
  std::lock_guard lock(mutex_);
  faults_.push_back({std::move(fault), 0});
}

void FaultFileSystem::power_loss_after(std::size_t calls) {
  std::lock_guard lock(mutex_);
  power_loss_after_ = calls;
  powered_off_ = calls_.size() >= calls;
}

bool FaultFileSystem::powered_off() const {
  std::lock_guard lock(mutex_);
  return powered_off_;
}

Status FaultFileSystem::reset() {
  std::lock_guard lock(mutex_);
  calls_.clear();
  faults_.clear();
  power_loss_after_.reset();
  powered_off_ = false;
  ++epoch_;
  return load_from_disk();
}

std::optional<Status> FaultFileSystem::refuse_without_power(const std::string& what) {
  if (power_loss_after_ && calls_.size() >= *power_loss_after_) powered_off_ = true;
  if (!powered_off_) return std::nullopt;
  return Status::from_errno(EIO, what);
}

std::optional<FsFault> FaultFileSystem::take_fault(FsOp op, const std::string& path,
                                                   const std::string& other) {
  std::optional<FsFault> fired;
  for (auto& armed : faults_) {
    const FsFault& f = armed.fault;
    if (f.op != op || armed.seen >= f.nth) continue;
    const bool matches = f.path_suffix.empty() || path.ends_with(f.path_suffix) ||
                         (!other.empty() && other.ends_with(f.path_suffix));
    if (!matches) continue;
    if (++armed.seen == f.nth && !fired) fired = f;
  }
  return fired;
}

Status FaultFileSystem::record(FsCall call, Status status) {
  call.index = calls_.size();
  call.status = status;
  calls_.push_back(std::move(call));
  return status;
}

// -- the model --

std::optional<std::vector<std::string>> FaultFileSystem::components(const std::string& path) const {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/')
    p.pop_back();
  if (p == root_) return std::vector<std::string>{};
  if (!p.starts_with(root_ + "/")) return std::nullopt;
  std::vector<std::string> out;
  std::size_t at = root_.size() + 1;
  while (at <= p.size()) {
    const std::size_t slash = std::min(p.find('/', at), p.size());
    std::string name = p.substr(at, slash - at);
    if (name == "..") return std::nullopt;
    if (!name.empty() && name != ".") out.push_back(std::move(name));
    at = slash + 1;
  }
  return out;
}

std::optional<std::size_t> FaultFileSystem::find(const std::string& path) const {
  auto names = components(path);
  if (!names) return std::nullopt;
  std::size_t at = 0;
  for (const auto& name : *names) {
    const Inode& dir = inodes_[at];
    if (!dir.is_dir) return std::nullopt;
    auto it = dir.entries.find(name);
    if (it == dir.entries.end()) return std::nullopt;
    at = it->second;
  }
  return at;
}

Result<std::optional<FaultFileSystem::Place>> FaultFileSystem::place_of(
    const std::string& path) const {
  auto names = components(path);
  if (!names || names->empty()) return std::optional<Place>{};
  std::string parent = root_;
  for (std::size_t i = 0; i + 1 < names->size(); ++i)
    parent += "/" + (*names)[i];
  auto dir = find(parent);
  if (!dir || !inodes_[*dir].is_dir) {
    return Status{ErrorCode::internal,
                  "the fault file system has no folder '" + parent + "' in its model"};
  }
  return std::optional<Place>{Place{*dir, names->back()}};
}

std::size_t FaultFileSystem::new_inode(bool is_dir) {
  Inode inode;
  inode.is_dir = is_dir;
  inodes_.push_back(std::move(inode));
  return inodes_.size() - 1;
}

void FaultFileSystem::change_dir(
    std::size_t call, std::size_t dir,
    std::vector<std::pair<std::string, std::optional<std::size_t>>> names) {
  auto& entries = inodes_[dir].entries;
  for (const auto& [name, inode] : names) {
    if (inode) {
      entries[name] = *inode;
    } else {
      entries.erase(name);
    }
  }
  journal_.push_back({call, dir, std::move(names)});
}

Status FaultFileSystem::load_from_disk() {
  inodes_.clear();
  journal_.clear();
  new_inode(true);
  SH_ASSIGN_OR_RETURN(DiskImage image, read_image(root_));
  for (auto& [path, bytes] : image) {
    SH_ASSIGN_OR_RETURN(auto place, place_of(root_ + "/" + path));
    const std::size_t inode = new_inode(!bytes.has_value());
    if (bytes) {
      inodes_[inode].data = *bytes;
      inodes_[inode].synced_data = std::move(*bytes);
    }
    inodes_[place->dir].entries[place->name] = inode;
    inodes_[place->dir].synced_entries[place->name] = inode;
  }
  return Status::ok();
}

bool FaultFileSystem::modelled(const File& file) const {
  return file.inode_.has_value() && file.epoch_ == epoch_;
}

std::vector<CrashOutcome> FaultFileSystem::crash_outcomes() const {
  std::lock_guard lock(mutex_);
  std::vector<CrashOutcome> out;
  std::set<std::set<std::size_t>> seen;
  auto add = [&](std::string name, std::set<std::size_t> kept) {
    if (seen.insert(kept).second) out.push_back({std::move(name), std::move(kept)});
  };
  std::set<std::size_t> pending;
  for (const auto& change : journal_)
    pending.insert(change.call);
  add("every unsynced folder change lost", {});
  add("every unsynced folder change kept", pending);
  // A later change builds on an earlier one of the same name in the same folder, and on the one
  // that linked the folder it happens in.
  auto builds_on = [&](const DirChange& later, const DirChange& earlier) {
    for (const auto& [name, inode] : earlier.names) {
      if (inode && *inode == later.dir) return true;
      if (earlier.dir != later.dir) continue;
      for (const auto& other : later.names) {
        if (other.first == name) return true;
      }
    }
    return false;
  };
  for (std::size_t call : pending) {
    std::set<std::size_t> kept{call};
    for (bool grew = true; grew;) {
      grew = false;
      for (std::size_t i = 0; i < journal_.size(); ++i) {
        if (kept.count(journal_[i].call) != 0) continue;
        for (std::size_t j = i + 1; j < journal_.size(); ++j) {
          if (kept.count(journal_[j].call) != 0 && builds_on(journal_[j], journal_[i])) {
            kept.insert(journal_[i].call);
            grew = true;
            break;
          }
        }
      }
    }
    add("only the folder changes of call " + calls_[call].to_string() + " and what it builds on",
        std::move(kept));
  }
  return out;
}

DiskImage FaultFileSystem::crash_image(const CrashOutcome& outcome) const {
  std::lock_guard lock(mutex_);
  std::vector<std::map<std::string, std::size_t>> entries(inodes_.size());
  for (std::size_t i = 0; i < inodes_.size(); ++i)
    entries[i] = inodes_[i].synced_entries;
  for (const auto& change : journal_) {
    if (outcome.kept.count(change.call) == 0) continue;
    for (const auto& [name, inode] : change.names) {
      if (inode) {
        entries[change.dir][name] = *inode;
      } else {
        entries[change.dir].erase(name);
      }
    }
  }
  DiskImage image;
  std::set<std::size_t> visited{0};
  std::vector<std::pair<std::size_t, std::string>> todo{{0, ""}};
  while (!todo.empty()) {
    auto [dir, prefix] = todo.back();
    todo.pop_back();
    for (const auto& [name, inode] : entries[dir]) {
      const std::string path = prefix.empty() ? name : prefix + "/" + name;
      if (!inodes_[inode].is_dir) {
        image[path] = inodes_[inode].synced_data;
      } else if (visited.insert(inode).second) {
        image[path] = std::nullopt;
        todo.emplace_back(inode, path);
      }
    }
  }
  return image;
}

// -- the FileSystem --

Result<std::unique_ptr<WritableFile>> FaultFileSystem::create_file(const std::string& path) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot create '" + path + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::create_file;
  call.path = path;
  if (auto fault = take_fault(FsOp::create_file, path, "")) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  auto inner_file = inner().create_file(path);
  if (!inner_file.is_ok()) return record(std::move(call), inner_file.status());
  auto place = place_of(path);
  if (!place.is_ok()) return record(std::move(call), place.status());
  std::optional<std::size_t> inode;
  if (*place) {
    const Place& p = **place;
    auto it = inodes_[p.dir].entries.find(p.name);
    if (it != inodes_[p.dir].entries.end()) {
      // O_TRUNC empties the file that is there; its synced bytes stay until the next sync.
      inode = it->second;
      inodes_[*inode].data.clear();
    } else {
      inode = new_inode(false);
      change_dir(calls_.size(), p.dir, {{p.name, inode}});
    }
  }
  (void)record(std::move(call), Status::ok());
  return std::unique_ptr<WritableFile>(
      std::make_unique<File>(*this, std::move(*inner_file), path, inode, epoch_));
}

Result<std::unique_ptr<ReadableFile>> FaultFileSystem::open_file(const std::string& path) {
  {
    std::lock_guard lock(mutex_);
    if (auto fault = take_fault(FsOp::open_file, path, "")) {
      return Status::from_errno(fault->error, "cannot open '" + path + "'");
    }
  }
  SH_ASSIGN_OR_RETURN(auto file, inner().open_file(path));
  return std::unique_ptr<ReadableFile>(std::make_unique<ReadFile>(*this, std::move(file), path));
}

Status FaultFileSystem::check_read(const std::string& path) {
  std::lock_guard lock(mutex_);
  if (auto fault = take_fault(FsOp::read, path, "")) {
    return Status::from_errno(fault->error, "read of '" + path + "'");
  }
  return Status::ok();
}

Status FaultFileSystem::write(File& file, FsOp op, std::uint64_t offset, const void* data,
                              std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const std::string what = "write to '" + file.path_ + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = op;
  call.path = file.path_;
  call.offset = offset;
  call.bytes = bytes;
  auto fault = take_fault(op, file.path_, "");
  Status result;
  const auto* src = static_cast<const char*>(data);
  std::size_t reach = bytes;
  std::string torn;
  if (fault) {
    reach =
        static_cast<std::size_t>(std::min<std::uint64_t>(fault->written_bytes.value_or(0), bytes));
    if (fault->torn && fault->written_bytes) {
      torn.assign(src, reach);
      torn.resize(bytes, '\0');
      src = torn.data();
      reach = bytes;
    } else {
      result = Status::from_errno(fault->error, what);
    }
  }
  if (reach > 0) {
    Status st = op == FsOp::append ? file.inner_->append(src, reach)
                                   : file.inner_->write_at(offset, src, reach);
    if (!st.is_ok()) return record(std::move(call), st);
    if (modelled(file)) {
      std::string& contents = inodes_[*file.inode_].data;
      if (contents.size() < offset + reach) contents.resize(offset + reach, '\0');
      std::memcpy(contents.data() + offset, src, reach);
    }
    if (op == FsOp::append) file.position_ += reach;
  }
  return record(std::move(call), result);
}

Status FaultFileSystem::sync_file(File& file) {
  std::lock_guard lock(mutex_);
  const std::string what = "fsync of '" + file.path_ + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::sync;
  call.path = file.path_;
  if (auto fault = take_fault(FsOp::sync, file.path_, "")) {
    // As after a real failed fsync, what was written may never reach the disk.
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = real_syncs_ ? file.inner_->sync() : Status::ok();
  if (st.is_ok() && modelled(file)) {
    Inode& inode = inodes_[*file.inode_];
    inode.synced_data = inode.data;
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::close_file(File& file) {
  std::lock_guard lock(mutex_);
  const std::string what = "close of '" + file.path_ + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::close;
  call.path = file.path_;
  if (auto fault = take_fault(FsOp::close, file.path_, "")) {
    (void)file.inner_->close();
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  return record(std::move(call), file.inner_->close());
}

Status FaultFileSystem::remove_file(const std::string& path) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot remove '" + path + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::remove_file;
  call.path = path;
  if (auto fault = take_fault(FsOp::remove_file, path, "")) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = inner().remove_file(path);
  if (!st.is_ok()) return record(std::move(call), st);
  auto place = place_of(path);
  if (!place.is_ok()) return record(std::move(call), place.status());
  if (*place && inodes_[(*place)->dir].entries.count((*place)->name) != 0) {
    change_dir(calls_.size(), (*place)->dir, {{(*place)->name, std::nullopt}});
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::create_dir(const std::string& path) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot create folder '" + path + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::create_dir;
  call.path = path;
  if (auto fault = take_fault(FsOp::create_dir, path, "")) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = inner().create_dir(path);
  if (!st.is_ok()) return record(std::move(call), st);
  auto place = place_of(path);
  if (!place.is_ok()) return record(std::move(call), place.status());
  if (*place && inodes_[(*place)->dir].entries.count((*place)->name) == 0) {
    const std::size_t inode = new_inode(true);
    change_dir(calls_.size(), (*place)->dir, {{(*place)->name, inode}});
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::remove_tree(const std::string& path) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot remove '" + path + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::remove_tree;
  call.path = path;
  if (auto fault = take_fault(FsOp::remove_tree, path, "")) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = inner().remove_tree(path);
  if (!st.is_ok()) return record(std::move(call), st);
  auto names = components(path);
  if (names && names->empty()) {
    // The modelled folder itself: every entry goes, in one change of it.
    std::vector<std::pair<std::string, std::optional<std::size_t>>> removed;
    for (const auto& entry : inodes_[0].entries)
      removed.emplace_back(entry.first, std::nullopt);
    if (!removed.empty()) change_dir(calls_.size(), 0, std::move(removed));
    return record(std::move(call), st);
  }
  auto place = place_of(path);
  // Below a folder that is not there, nothing was removed.
  if (!place.is_ok()) return record(std::move(call), st);
  if (*place && inodes_[(*place)->dir].entries.count((*place)->name) != 0) {
    change_dir(calls_.size(), (*place)->dir, {{(*place)->name, std::nullopt}});
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::sync_dir(const std::string& path) {
  std::lock_guard lock(mutex_);
  const std::string what = "fsync of folder '" + path + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::sync_dir;
  call.path = path;
  if (auto fault = take_fault(FsOp::sync_dir, path, "")) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = real_syncs_ ? inner().sync_dir(path) : Status::ok();
  if (!st.is_ok()) return record(std::move(call), st);
  if (auto dir = find(path); dir && inodes_[*dir].is_dir) {
    inodes_[*dir].synced_entries = inodes_[*dir].entries;
    std::erase_if(journal_, [&](const DirChange& change) { return change.dir == *dir; });
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::rename(const std::string& from, const std::string& to) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot rename '" + from + "' to '" + to + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::rename;
  call.path = from;
  call.other = to;
  if (auto fault = take_fault(FsOp::rename, from, to)) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = inner().rename(from, to);
  if (!st.is_ok()) return record(std::move(call), st);
  auto source = place_of(from);
  auto target = place_of(to);
  if (!source.is_ok()) return record(std::move(call), source.status());
  if (!target.is_ok()) return record(std::move(call), target.status());
  if (!*source || !*target) {
    if (*source || *target) {
      return record(std::move(call), Status{ErrorCode::internal,
                                            "the fault file system cannot model a rename into "
                                            "or out of '" +
                                                root_ + "'"});
    }
    return record(std::move(call), st);
  }
  const Place& s = **source;
  const Place& t = **target;
  const std::size_t inode = inodes_[s.dir].entries.at(s.name);
  if (s.dir == t.dir) {
    change_dir(calls_.size(), s.dir, {{s.name, std::nullopt}, {t.name, inode}});
  } else {
    change_dir(calls_.size(), s.dir, {{s.name, std::nullopt}});
    change_dir(calls_.size(), t.dir, {{t.name, inode}});
  }
  return record(std::move(call), st);
}

Status FaultFileSystem::exchange(const std::string& a, const std::string& b) {
  std::lock_guard lock(mutex_);
  const std::string what = "cannot swap '" + a + "' with '" + b + "'";
  if (auto refused = refuse_without_power(what)) return *refused;
  FsCall call;
  call.op = FsOp::exchange;
  call.path = a;
  call.other = b;
  if (auto fault = take_fault(FsOp::exchange, a, b)) {
    return record(std::move(call), Status::from_errno(fault->error, what));
  }
  Status st = inner().exchange(a, b);
  if (!st.is_ok()) return record(std::move(call), st);
  auto first = place_of(a);
  auto second = place_of(b);
  if (!first.is_ok()) return record(std::move(call), first.status());
  if (!second.is_ok()) return record(std::move(call), second.status());
  if (!*first || !*second) {
    if (*first || *second) {
      return record(std::move(call), Status{ErrorCode::internal,
                                            "the fault file system cannot model a swap across "
                                            "'" +
                                                root_ + "'"});
    }
    return record(std::move(call), st);
  }
  const Place& x = **first;
  const Place& y = **second;
  const std::size_t inode_a = inodes_[x.dir].entries.at(x.name);
  const std::size_t inode_b = inodes_[y.dir].entries.at(y.name);
  if (x.dir == y.dir) {
    change_dir(calls_.size(), x.dir, {{x.name, inode_b}, {y.name, inode_a}});
  } else {
    change_dir(calls_.size(), x.dir, {{x.name, inode_b}});
    change_dir(calls_.size(), y.dir, {{y.name, inode_a}});
  }
  return record(std::move(call), st);
}

}  // namespace stagehand::test
