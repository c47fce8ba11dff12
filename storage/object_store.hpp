#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/destination.hpp"

namespace stagehand {

/// How to reach an S3-compatible object store (AWS S3, MinIO, Ceph, R2, or Google Cloud Storage
/// through its XML API with HMAC keys), and how hard to try.
struct ObjectStoreOptions {
  /// Base URL such as `http://127.0.0.1:9000`; empty: `https://s3.<region>.amazonaws.com` for
  /// s3://, `https://storage.googleapis.com` for gs://.
  std::string endpoint;
  /// Signing region; empty: us-east-1 for s3://, auto for gs://.
  std::string region;
  /// `<endpoint>/<bucket>/<key>` when true, `<bucket>.<endpoint host>/<key>` when false.
  bool path_style = true;
  std::string access_key_id;
  std::string secret_access_key;
  /// Temporary credentials' token, sent as x-amz-security-token; empty: none.
  std::string session_token;

  /// Tries of one request, the first included; throttling, 5xx answers, timeouts and broken
  /// connections are retried with exponential backoff and jitter.
  int max_attempts = 5;
  double initial_backoff_s = 0.2;
  double max_backoff_s = 10.0;
  /// A connection that cannot be made in this time is a failed try.
  long connect_timeout_s = 10;
  /// A transfer that moves less than 1 KiB/s for this long is a failed try.
  long stall_timeout_s = 30;

  /// Where files bound for the store are written before they are uploaded
  /// (megatron_config.local_work_dir).
  std::string spool_dir = "/tmp/stagehand-work";

  /// Files of at least this many bytes go up as multipart uploads.
  std::uint64_t multipart_threshold = 64ull << 20;
  /// Bytes per part (the last may be smaller); at least 5 MiB on S3.
  std::uint64_t part_size = 16ull << 20;
  /// Parts and files uploaded at once per rank.
  int upload_threads = 4;

  /// The defaults with the endpoint, region and credentials of the AWS environment variables
  /// (AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
  /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
  static ObjectStoreOptions from_environment();
};

/// `s3://bucket/key`, `gs://bucket/key` or `gcs://bucket/key`.
struct ObjectUrl {
  DestinationKind kind = DestinationKind::s3;
  std::string bucket;
  /// Without leading or trailing '/'; empty for the bucket's root.
  std::string key;

  /// Keys are restricted to letters, digits and `-_.~/` so that they need no escaping;
  /// anything else is an error naming the character.
  static Result<ObjectUrl> parse(const std::string& url);
  std::string str() const;
  /// The key `rel` below this one (`rel` has no leading '/').
  std::string key_of(const std::string& rel) const;
};

struct ObjectInfo {
  std::string key;
  std::uint64_t size = 0;
  /// The ETag the store gave it (HEAD only; empty in listings).
  std::string etag;
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

/// A local file and the key it goes to.
struct FileUpload {
  std::string local_path;
  std::string key;
};

/// One bucket of an S3-compatible object store, spoken to over HTTP(S) by libcurl with its
/// built-in AWS Signature V4.
///
/// Every request is retried on throttling (429, SlowDown), 5xx answers, timeouts and broken
/// connections, up to `max_attempts` tries with exponential backoff and jitter; after that the
/// error names the method, the object, the endpoint and the server's answer. Wrong credentials
/// are `permission_denied`, a missing bucket or object `not_found`, an unreachable endpoint
/// `io_error` saying so.
///
/// Thread-safety: every method may be called from several threads at once; each thread keeps
/// its own connection.
class Bucket {
 public:
  /// Checks the options (credentials present, endpoint well formed); reaches nothing yet.
  static Result<std::shared_ptr<Bucket>> open(DestinationKind kind, std::string bucket,
                                              ObjectStoreOptions options);

  // -- properties --

  const std::string& name() const { return bucket_; }
  const ObjectStoreOptions& options() const { return options_; }
  /// `s3://bucket/key` (or gs://), for messages.
  std::string url(const std::string& key) const;

  // -- requests --

  /// Lists one key below `prefix`: proves the endpoint answers, the credentials are accepted and
  /// the bucket exists, each with its own error.
  Status check_access(const std::string& prefix);
  /// The size of object `key`; nullopt when there is none.
  Result<std::optional<std::uint64_t>> size_of(const std::string& key);
  /// The size and ETag of object `key` (a HEAD); nullopt when there is none.
  Result<std::optional<ObjectInfo>> head(const std::string& key);
  /// The whole object (for small ones); nullopt when there is none.
  Result<std::optional<std::string>> get(const std::string& key);
  /// Exactly `bytes` bytes from `offset` of object `key` into `dst` (a ranged GET).
  Status get_range(const std::string& key, std::uint64_t offset, std::size_t bytes, void* dst);
  Status put(const std::string& key, std::string_view body);
  /// Uploads every file, each with one PUT below multipart_threshold and as a multipart upload
  /// of part_size parts at or above it; the parts and files of all go up on upload_threads
  /// threads at once. The first failure stops the rest, and every multipart upload begun is
  /// aborted so that no parts stay stored; when even the abort fails, the error says which upload
  /// is left open.
  Status upload_files(const std::vector<FileUpload>& files);
  /// Every object whose key starts with `prefix`, in key order (as S3 lists them); with
  /// `max_keys` > 0, at most that many.
  Result<std::vector<ObjectInfo>> list(const std::string& prefix, std::size_t max_keys = 0);
  /// Deletes object `key`; a missing one is not an error.
  Status remove(const std::string& key);
  /// Multipart uploads begun and neither completed nor aborted, below `prefix`: all of them,
  /// page after page.
  Result<std::vector<MultipartUpload>> open_uploads(const std::string& prefix);
  Status abort_upload(const MultipartUpload& upload);

 private:
  Bucket(DestinationKind kind, std::string bucket, ObjectStoreOptions options,
         std::string endpoint);

  struct Request;
  struct Response;
  /// One request with the retry policy; `what` names it in errors.
  Result<Response> perform(const Request& request, const std::string& what);
  Result<Response> perform_once(const Request& request);
  std::string request_url(const std::string& key, const std::string& query) const;

  DestinationKind kind_;
  std::string bucket_;
  ObjectStoreOptions options_;
  std::string endpoint_;
  std::string sigv4_;
};

}  // namespace stagehand
