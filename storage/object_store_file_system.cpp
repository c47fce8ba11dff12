// An object store as a FileSystem: keys under `s3://bucket/...` stand for files, key prefixes
// for folders.
#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/storage/destination.hpp"
#include "stagehand/storage/posix_io.hpp"

namespace stagehand {

namespace {

/// A file on its way to an object: written into a local spool file, uploaded whole by sync().
class SpoolFile final : public WritableFile {
 public:
  SpoolFile(std::shared_ptr<Bucket> bucket, std::string key, std::string spool, posix::Fd fd)
      : bucket_(std::move(bucket)),
        key_(std::move(key)),
        spool_(std::move(spool)),
        fd_(std::move(fd)) {}
  ~SpoolFile() override { (void)::unlink(spool_.c_str()); }

  Status append(const void* data, std::size_t bytes) override {
    SH_RETURN_IF_ERROR(write_at(end_, data, bytes));
    return Status::ok();
  }

  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    if (uploaded_) return {ErrorCode::internal, "'" + bucket_->url(key_) + "' is already uploaded"};
    const auto* p = static_cast<const std::uint8_t*>(data);
    for (std::size_t done = 0; done < bytes;) {
      ssize_t n = ::pwrite(fd_.get(), p + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::from_errno(
            errno, "write to '" + spool_ + "' (spooling '" + bucket_->url(key_) + "')");
      }
      done += static_cast<std::size_t>(n);
    }
    std::lock_guard lock(mutex_);
    end_ = std::max<std::uint64_t>(end_, offset + bytes);
    return Status::ok();
  }

  Status sync() override {
    if (uploaded_) return Status::ok();
    SH_RETURN_IF_ERROR(bucket_->upload_files({{spool_, key_}}));
    uploaded_ = true;
    return Status::ok();
  }

  Status close() override {
    fd_ = posix::Fd();
    if (::unlink(spool_.c_str()) != 0 && errno != ENOENT)
      return Status::from_errno(errno, "cannot remove '" + spool_ + "'");
    return Status::ok();
  }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
  std::string spool_;
  posix::Fd fd_;
  std::mutex mutex_;
  std::uint64_t end_ = 0;
  bool uploaded_ = false;
};

class ObjectFile final : public ReadableFile {
 public:
  ObjectFile(std::shared_ptr<Bucket> bucket, std::string key, std::uint64_t size)
      : bucket_(std::move(bucket)), key_(std::move(key)), size_(size) {}
  std::uint64_t size() const override { return size_; }

  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
    if (offset + bytes > size_) {
      return Status{ErrorCode::corruption, "'" + bucket_->url(key_) + "' has " +
                                               std::to_string(size_) + " bytes, a read of " +
                                               std::to_string(bytes) + " at " +
                                               std::to_string(offset) + " runs past it"};
    }
    return bucket_->get_range(key_, offset, bytes, dst);
  }

  Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
    if (segments.size() == 1) return read(offset, segments[0].dst, segments[0].bytes);
    // One ranged GET for the whole run, then scattered: a GET has one destination.
    std::size_t total = 0;
    for (const auto& s : segments)
      total += s.bytes;
    HostBuffer run(total, false, &staging_memory());
    if (total > 0 && !run.valid()) {
      return Status{ErrorCode::no_space, "cannot allocate " + std::to_string(total) +
                                             " bytes to read '" + bucket_->url(key_) + "'"};
    }
    SH_RETURN_IF_ERROR(read(offset, run.data(), total));
    std::size_t at = 0;
    for (const auto& s : segments) {
      std::copy_n(run.data() + at, s.bytes, static_cast<std::uint8_t*>(s.dst));
      at += s.bytes;
    }
    return Status::ok();
  }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::string key_;
  std::uint64_t size_;
};

Status no_rename(const std::string& path) {
  return {ErrorCode::unsupported, "'" + path + "' is in an object store, which cannot rename"};
}

class ObjectStoreFileSystem final : public FileSystem {
 public:
  explicit ObjectStoreFileSystem(ObjectStoreOptions options) : options_(std::move(options)) {}

  FileSystemCapabilities capabilities(const std::string&) const override {
    FileSystemCapabilities c;
    c.atomic_rename = false;
    c.directories = false;
    c.locks = false;
    c.uploads = true;
    c.rewrites_in_place = false;
    return c;
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    std::error_code ec;
    std::filesystem::create_directories(options_.spool_dir, ec);
    if (ec)
      return Status::from_errno(ec.value(),
                                "cannot create local_work_dir '" + options_.spool_dir + "'");
    // The pid in the name lets a later process tell a killed writer's spool from a live one's.
    std::string spool =
        options_.spool_dir + "/" + kSpoolPrefix + std::to_string(::getpid()) + "-XXXXXX";
    posix::Fd fd(::mkostemp(spool.data(), O_CLOEXEC));
    if (!fd.valid())
      return Status::from_errno(errno,
                                "cannot create a spool file in '" + options_.spool_dir + "'");
    return std::unique_ptr<WritableFile>(std::make_unique<SpoolFile>(
        std::move(where.bucket), std::move(where.key), std::move(spool), std::move(fd)));
  }

  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    SH_ASSIGN_OR_RETURN(auto size, where.bucket->size_of(where.key));
    if (!size) return Status{ErrorCode::not_found, "'" + path + "' does not exist"};
    return std::unique_ptr<ReadableFile>(
        std::make_unique<ObjectFile>(std::move(where.bucket), where.key, *size));
  }

  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    SH_ASSIGN_OR_RETURN(auto info, where.bucket->head(where.key));
    if (!info) return std::optional<FileVersion>{};
    return std::optional<FileVersion>{FileVersion{info->size, info->etag}};
  }

  Status remove_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    return where.bucket->remove(where.key);
  }

  Status create_dir(const std::string& path) override { return locate(path).status(); }

  Result<bool> is_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    SH_ASSIGN_OR_RETURN(auto objects, where.bucket->list(where.prefix(), 1));
    return !objects.empty();
  }

  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    const std::string prefix = where.prefix();
    SH_ASSIGN_OR_RETURN(auto objects, where.bucket->list(prefix));
    std::map<std::string, bool> children;
    for (const auto& o : objects) {
      const std::string rest = o.key.substr(prefix.size());
      const auto slash = rest.find('/');
      if (slash == std::string::npos) {
        children.emplace(rest, false);
      } else {
        children[rest.substr(0, slash)] = true;
      }
    }
    std::vector<DirEntry> out;
    for (const auto& [name, is_dir] : children)
      out.push_back({name, is_dir});
    return out;
  }

  Status remove_tree(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    SH_ASSIGN_OR_RETURN(auto objects, where.bucket->list(where.prefix()));
    for (const auto& o : objects)
      SH_RETURN_IF_ERROR(where.bucket->remove(o.key));
    return Status::ok();
  }

  Status sync_dir(const std::string& path) override { return locate(path).status(); }
  Status rename(const std::string& from, const std::string&) override { return no_rename(from); }
  Status exchange(const std::string& a, const std::string&) override { return no_rename(a); }

  Status check_access(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    return where.bucket->check_access(where.prefix());
  }

  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path,
                                              const std::string&) override {
    return Status{ErrorCode::unsupported,
                  "'" + path + "' is in an object store, which has no locks"};
  }

  Result<int> abort_unfinished_writes(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto where, locate(path));
    SH_ASSIGN_OR_RETURN(auto uploads, where.bucket->open_uploads(where.prefix()));
    for (const auto& u : uploads)
      SH_RETURN_IF_ERROR(where.bucket->abort_upload(u));
    remove_stale_spools();
    return static_cast<int>(uploads.size());
  }

 private:
  struct Where {
    std::shared_ptr<Bucket> bucket;
    std::string key;
    /// The key prefix of what lies below it as a folder.
    std::string prefix() const { return key.empty() ? "" : key + "/"; }
  };

  Result<Where> locate(const std::string& path) {
    SH_ASSIGN_OR_RETURN(ObjectUrl url, ObjectUrl::parse(path));
    const std::string name = url.str().substr(0, url.str().find("://") + 3) + url.bucket;
    std::lock_guard lock(mutex_);
    auto found = buckets_.find(name);
    if (found == buckets_.end()) {
      SH_ASSIGN_OR_RETURN(auto bucket, Bucket::open(url.kind, url.bucket, options_));
      found = buckets_.emplace(name, std::move(bucket)).first;
    }
    return Where{found->second, url.key};
  }

  /// Removes the spool files of processes that are gone (killed while writing); a live
  /// process's, another job's included, stay.
  void remove_stale_spools() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(options_.spool_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(kSpoolPrefix)) continue;
      const long pid = std::strtol(name.c_str() + std::strlen(kSpoolPrefix), nullptr, 10);
      if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      logger()->info("removing '{}', spooled by a process that is gone", entry.path().string());
      std::filesystem::remove(entry.path(), ec);
    }
  }

  static constexpr const char* kSpoolPrefix = ".spool-";

  ObjectStoreOptions options_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Bucket>> buckets_;
};

/// Routes each call by the path: object-store URLs to the object store, the rest to the disk.
class DefaultFileSystem final : public FileSystem {
 public:
  explicit DefaultFileSystem(const ObjectStoreOptions& options)
      : local_(local_file_system()), objects_(object_store_file_system(options)) {}

  FileSystemCapabilities capabilities(const std::string& path) const override {
    return at(path).capabilities(path);
  }
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    return at(path).create_file(path);
  }
  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    return at(path).open_file(path);
  }
  Result<std::unique_ptr<WritableFile>> create_file_uncached(const std::string& path) override {
    return at(path).create_file_uncached(path);
  }
  Result<std::unique_ptr<ReadableFile>> open_file_uncached(const std::string& path) override {
    return at(path).open_file_uncached(path);
  }
  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    return at(path).stat_file(path);
  }
  Status remove_file(const std::string& path) override { return at(path).remove_file(path); }
  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings* mappings) override {
    if (&at(from) != &at(to)) return no_rename(from);
    return at(from).reuse_file(from, to, mappings);
  }
  Result<std::unique_ptr<WritableFile>> reuse_file_uncached(const std::string& from, const std::string& to,
                                                            FileMappings* mappings) override {
    if (&at(from) != &at(to)) return no_rename(from);
    return at(from).reuse_file_uncached(from, to, mappings);
  }
  Status create_dir(const std::string& path) override { return at(path).create_dir(path); }
  Result<bool> is_dir(const std::string& path) override { return at(path).is_dir(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    return at(path).list_dir(path);
  }
  Status remove_tree(const std::string& path) override { return at(path).remove_tree(path); }
  Status sync_dir(const std::string& path) override { return at(path).sync_dir(path); }
  Status rename(const std::string& from, const std::string& to) override {
    if (&at(from) != &at(to)) return no_rename(from);
    return at(from).rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    if (&at(a) != &at(b)) return no_rename(a);
    return at(a).exchange(a, b);
  }
  Status check_access(const std::string& path) override { return at(path).check_access(path); }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path,
                                              const std::string& holder) override {
    return at(path).lock_file(path, holder);
  }
  Result<int> abort_unfinished_writes(const std::string& path) override {
    return at(path).abort_unfinished_writes(path);
  }

 private:
  FileSystem& at(const std::string& path) const { return is_cloud(path) ? *objects_ : *local_; }

  std::shared_ptr<FileSystem> local_;
  std::shared_ptr<FileSystem> objects_;
};

}  // namespace

std::shared_ptr<FileSystem> object_store_file_system(ObjectStoreOptions options) {
  return std::make_shared<ObjectStoreFileSystem>(std::move(options));
}

std::shared_ptr<FileSystem> default_file_system(const ObjectStoreOptions& options) {
  return std::make_shared<DefaultFileSystem>(options);
}

}  // namespace stagehand
