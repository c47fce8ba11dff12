#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/storage/object_store.hpp"
#include "tests/test_util.hpp"

namespace stagehand::test {

/// A checkpoint root in an object store as tests look at it: its CheckpointStore, and the bucket
/// underneath for listing objects directly.
struct CloudRoot {
  CheckpointStore store;
  std::shared_ptr<Bucket> bucket_;

  static Result<CloudRoot> open(const std::string& url, const ObjectStoreOptions& options) {
    SH_ASSIGN_OR_RETURN(ObjectUrl parsed, ObjectUrl::parse(url));
    SH_ASSIGN_OR_RETURN(auto bucket, Bucket::open(parsed.kind, parsed.bucket, options));
    return CloudRoot{CheckpointStore(default_file_system(options), url), bucket};
  }
  Result<std::optional<std::int64_t>> read_tracker() const { return store.tracker(); }
  Result<std::vector<std::int64_t>> committed_steps() const { return store.committed_steps(); }
  Result<bool> is_committed(std::int64_t step) const { return store.is_committed(step); }
  Bucket& bucket() const { return *bucket_; }
};

/// The loopback S3-compatible server of tests/integration/s3_server.py (moto, with signatures
/// checked), and optionally a proxy in front of it that can be taken down. Stopped on destruction.
class S3Server {
 public:
  /// @param buckets created at start. Throws (failing the test) when the server cannot start:
  /// moto and boto3 must be installed (scripts/install-deps.sh does).
  explicit S3Server(const std::vector<std::string>& buckets, bool proxy = false) {
    int to_child[2];
    int from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    // Everything the child needs is built before fork (allocating after fork is unsafe).
    std::vector<std::string> args{"python3", source_dir() + "/tests/integration/s3_server.py"};
    for (const auto& b : buckets) args.insert(args.end(), {"--bucket", b});
    if (proxy) args.push_back("--proxy");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 2);
      ::execvp("python3", argv.data());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
    auto info = nlohmann::json::parse(read_line(), nullptr, false);
    if (info.is_discarded() || !info.contains("endpoint")) {
      throw std::runtime_error("the S3 test server (tests/integration/s3_server.py) did not start: is moto[server] "
                               "installed? run scripts/install-deps.sh");
    }
    endpoint_ = info["endpoint"];
    proxy_endpoint_ = info["proxy_endpoint"];
    access_key_ = info["access_key"];
    secret_key_ = info["secret_key"];
  }
  ~S3Server() {
    if (in_ != nullptr) std::fclose(in_);
    if (out_ != nullptr) std::fclose(out_);
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& proxy_endpoint() const { return proxy_endpoint_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }

  /// Options that reach the server directly (or through the proxy), with quick retries.
  ObjectStoreOptions options(bool through_proxy = false) const {
    ObjectStoreOptions o;
    o.endpoint = through_proxy ? proxy_endpoint_ : endpoint_;
    o.region = "us-east-1";
    o.access_key_id = access_key_;
    o.secret_access_key = secret_key_;
    o.initial_backoff_s = 0.05;
    o.max_backoff_s = 0.2;
    o.max_attempts = 4;
    o.connect_timeout_s = 2;
    o.stall_timeout_s = 5;
    return o;
  }

  /// Environment assignments for a child process (`env A=B ... command`).
  std::string env(bool through_proxy = false) const {
    return "AWS_ACCESS_KEY_ID=" + access_key_ + " AWS_SECRET_ACCESS_KEY='" + secret_key_ +
           "' AWS_ENDPOINT_URL=" + (through_proxy ? proxy_endpoint_ : endpoint_) + " AWS_REGION=us-east-1";
  }

  /// Sends one command to the helper and returns its one-line answer.
  std::string command(const std::string& line) {
    std::fprintf(in_, "%s\n", line.c_str());
    std::fflush(in_);
    return read_line();
  }

 private:
  std::string read_line() {
    std::string line;
    for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
    return line;
  }

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string endpoint_;
  std::string proxy_endpoint_;
  std::string access_key_;
  std::string secret_key_;
};

}  // namespace stagehand::test
