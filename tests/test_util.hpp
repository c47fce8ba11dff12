#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand::test {

/// Sets how long the process's foreground gate holds background work back, for one scope: a
/// test that checks what waits there takes a limit that a loaded machine cannot reach.
class GateLimit {
 public:
  explicit GateLimit(std::chrono::milliseconds limit) { foreground_gate().set_limit(limit); }
  ~GateLimit() { foreground_gate().set_limit(old_); }
  GateLimit(const GateLimit&) = delete;
  GateLimit& operator=(const GateLimit&) = delete;

 private:
  std::chrono::milliseconds old_ = foreground_gate().limit();
};

/// Whether the file system of folder `dir` takes O_DIRECT.
inline bool takes_direct_io(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

/// How many of the file's pages are in the page cache (mincore of a mapping); throws when the
/// file cannot be mapped.
inline std::size_t cached_pages(const std::string& path) {
  const auto size = static_cast<std::size_t>(std::filesystem::file_size(path));
  if (size == 0) return 0;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "'");
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("cannot map '" + path + "'");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  const int got = ::mincore(map, size, resident.data());
  ::munmap(map, size);
  if (got != 0) throw std::runtime_error("mincore of '" + path + "' failed");
  std::size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

/// A fresh folder under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() : TempDir(std::filesystem::temp_directory_path().string()) {}
  /// A fresh folder below the folder `parent`.
  explicit TempDir(const std::string& parent) {
    std::string pattern = parent + "/stagehand-test-XXXXXX";
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Where the built programs are; STAGEHAND_BIN_DIR in the environment overrides the build's
/// folder (the GPU check runs the tests from an unpacked copy).
inline std::string bin_dir() {
  const char* env = std::getenv("STAGEHAND_BIN_DIR");
  return env != nullptr ? env : STAGEHAND_BIN_DIR;
}

/// The source tree (configs, scripts, Python helpers); STAGEHAND_SOURCE_DIR in the environment
/// overrides it.
inline std::string source_dir() {
  const char* env = std::getenv("STAGEHAND_SOURCE_DIR");
  return env != nullptr ? env : STAGEHAND_SOURCE_DIR;
}

/// Every regular file below `dir`, by relative path, with its bytes.
inline std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      out[std::filesystem::relative(entry.path(), dir).string()] = read_file(entry.path().string());
    }
  }
  return out;
}

/// "" when the step folder `b_dir` holds the files of the checkpoint in `a_dir` (one with
/// policy/metadata.json) byte for byte and no others; else what differs first.
inline std::string checkpoint_difference(const std::string& a_dir, const std::string& b_dir) {
  const auto a = files_of(a_dir);
  const auto b = files_of(b_dir);
  if (a.count("policy/metadata.json") != 1) return a_dir + " holds no policy/metadata.json";
  if (a.size() != b.size()) {
    return a_dir + " holds " + std::to_string(a.size()) + " files, " + b_dir + " " + std::to_string(b.size());
  }
  for (const auto& [name, bytes] : a) {
    auto it = b.find(name);
    if (it == b.end()) return name + " is missing in " + b_dir;
    if (it->second != bytes) return name + " differs in " + b_dir;
  }
  return "";
}

/// A TCP port on 127.0.0.1 that nobody listened on a moment ago.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

/// What a command printed (stdout and stderr) and its exit code.
struct CommandRun {
  int code = -1;
  std::string output;
};

inline CommandRun run_command(const std::string& command) {
  CommandRun r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), pipe)) r.output.append(buf, n);
  int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// A host tensor of `shape` filled with random bytes from `seed`.
inline Tensor random_tensor(DType dtype, const Shape& shape, std::uint32_t seed) {
  Tensor t = *Tensor::empty(dtype, shape, Device::host());
  std::mt19937 rng(seed);
  auto* bytes = t.host_data<std::uint8_t>();
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<std::uint8_t>(rng());
  return t;
}

inline Tensor zero_tensor(DType dtype, const Shape& shape) {
  Tensor t = *Tensor::empty(dtype, shape, Device::host());
  std::fill_n(t.host_data<std::uint8_t>(), t.nbytes(), 0);
  return t;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         std::equal(static_cast<const std::uint8_t*>(a.data()),
                    static_cast<const std::uint8_t*>(a.data()) + a.nbytes(),
                    static_cast<const std::uint8_t*>(b.data()));
}

/// A copy of `state` with the same descriptors and zeroed data, to load into.
inline StateDict zeroed_like(const StateDict& state) {
  StateDict out;
  for (const auto& t : state.tensors) {
    out.tensors.push_back({t.desc, zero_tensor(t.desc.dtype, t.desc.local_shape)});
  }
  return out;
}

/// Wraps the local file system: slows writes, fails a chosen file with an errno, and records
/// which files were created.
class FaultStorage final : public FileSystemWrapper {
 public:
  FaultStorage() : FileSystemWrapper(local_file_system()) {}

  /// Files whose name contains this fail their first write with `fail_errno`.
  std::string fail_file;
  int fail_errno = EIO;
  /// Sleep before each write.
  std::chrono::milliseconds append_delay{0};
  /// Called on the writer thread before a file is created.
  std::function<void(const std::string& path)> on_open;

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    if (on_open) on_open(path);
    {
      std::lock_guard lock(mutex_);
      created_.insert(std::filesystem::path(path).filename().string());
    }
    SH_ASSIGN_OR_RETURN(auto inner, inner().create_file(path));
    bool fail = !fail_file.empty() && path.find(fail_file) != std::string::npos;
    return std::unique_ptr<WritableFile>(
        std::make_unique<File>(std::move(inner), fail ? fail_errno : 0, append_delay, path));
  }

  std::set<std::string> created() {
    std::lock_guard lock(mutex_);
    return created_;
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> inner, int fail_errno, std::chrono::milliseconds delay,
         std::string path)
        : inner_(std::move(inner)), fail_errno_(fail_errno), delay_(delay), path_(std::move(path)) {}
    Status append(const void* data, std::size_t bytes) override {
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      if (fail_errno_ != 0) return Status::from_errno(fail_errno_, "write to '" + path_ + "'");
      return inner_->append(data, bytes);
    }
    Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      if (fail_errno_ != 0) return Status::from_errno(fail_errno_, "write to '" + path_ + "'");
      return inner_->write_at(offset, data, bytes);
    }
    Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
      return inner_->start_writeback(offset, bytes);
    }
    Status sync() override { return inner_->sync(); }
    Status close() override { return inner_->close(); }

   private:
    std::unique_ptr<WritableFile> inner_;
    int fail_errno_;
    std::chrono::milliseconds delay_;
    std::string path_;
  };

  std::mutex mutex_;
  std::set<std::string> created_;
};

}  // namespace stagehand::test
