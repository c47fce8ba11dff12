#include "stagehand/storage/object_store.hpp"

#include <algorithm>
#include <cstdlib>

#include "stagehand/storage/s3_request.hpp"

namespace stagehand {

using s3::answer_root;
using s3::key_char_ok;
using s3::kMinPartSize;
using s3::query_value;
using s3::scheme_of;

namespace {

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

}  // namespace

// -- options --

ObjectStoreOptions ObjectStoreOptions::from_environment() {
  ObjectStoreOptions o;
  o.endpoint = env_or("AWS_ENDPOINT_URL_S3", env_or("AWS_ENDPOINT_URL"));
  o.region = env_or("AWS_REGION", env_or("AWS_DEFAULT_REGION"));
  o.access_key_id = env_or("AWS_ACCESS_KEY_ID");
  o.secret_access_key = env_or("AWS_SECRET_ACCESS_KEY");
  o.session_token = env_or("AWS_SESSION_TOKEN");
  return o;
}

// -- URLs --

Result<ObjectUrl> ObjectUrl::parse(const std::string& url) {
  ObjectUrl out;
  out.kind = classify_destination(url);
  if (out.kind == DestinationKind::local) {
    return Status{ErrorCode::invalid_argument,
                  "'" + url + "' is not an object-store URL (s3://, gs://)"};
  }
  std::string rest = url.substr(url.find("://") + 3);
  auto slash = rest.find('/');
  out.bucket = rest.substr(0, slash);
  std::string key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!key.empty() && key.back() == '/')
    key.pop_back();
  if (out.bucket.size() < 3 || out.bucket.size() > 63 ||
      !std::all_of(out.bucket.begin(), out.bucket.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
      })) {
    return Status{ErrorCode::invalid_argument,
                  "'" + url + "': bucket name '" + out.bucket +
                      "' must be 3-63 lowercase letters, digits, '-', '.'"};
  }
  for (char c : key) {
    if (!key_char_ok(c)) {
      return Status{ErrorCode::invalid_argument,
                    "'" + url + "': the character '" + std::string(1, c) +
                        "' is not allowed in object keys here (letters, digits and "
                        "-_.~/ are)"};
    }
  }
  if (key.find("//") != std::string::npos || (!key.empty() && key.front() == '/')) {
    return Status{ErrorCode::invalid_argument, "'" + url + "' has an empty path segment"};
  }
  out.key = key;
  return out;
}

std::string ObjectUrl::str() const {
  return std::string(scheme_of(kind)) + "://" + bucket + (key.empty() ? "" : "/" + key);
}

std::string ObjectUrl::key_of(const std::string& rel) const {
  return key.empty() ? rel : key + "/" + rel;
}

// -- bucket --

Result<std::shared_ptr<Bucket>> Bucket::open(DestinationKind kind, std::string bucket,
                                             ObjectStoreOptions options) {
  std::string where = std::string(scheme_of(kind)) + "://" + bucket;
  if (options.access_key_id.empty() || options.secret_access_key.empty()) {
    return Status{ErrorCode::permission_denied,
                  "no credentials for '" + where +
                      "': set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" +
                      (kind == DestinationKind::gcs ? " to a Cloud Storage HMAC key" : "")};
  }
  if (options.region.empty()) options.region = kind == DestinationKind::gcs ? "auto" : "us-east-1";
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) {
    endpoint = kind == DestinationKind::gcs ? "https://storage.googleapis.com"
                                            : "https://s3." + options.region + ".amazonaws.com";
  }
  while (!endpoint.empty() && endpoint.back() == '/')
    endpoint.pop_back();
  if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0) {
    return Status{ErrorCode::config_error,
                  "object-store endpoint '" + endpoint + "' must start with http:// or https://"};
  }
  if (options.max_attempts < 1 || options.upload_threads < 1) {
    return Status{ErrorCode::config_error,
                  "object-store max_attempts and upload_threads must be at least 1"};
  }
  if (options.part_size < kMinPartSize || options.multipart_threshold < options.part_size) {
    return Status{
        ErrorCode::config_error,
        "object-store part size must be at least 5 MiB and at most the multipart threshold"};
  }
  return std::shared_ptr<Bucket>(
      new Bucket(kind, std::move(bucket), std::move(options), std::move(endpoint)));
}

Bucket::Bucket(DestinationKind kind, std::string bucket, ObjectStoreOptions options,
               std::string endpoint)
    : kind_(kind),
      bucket_(std::move(bucket)),
      options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      sigv4_("aws:amz:" + options_.region + ":s3") {}

std::string Bucket::url(const std::string& key) const {
  return std::string(scheme_of(kind_)) + "://" + bucket_ + (key.empty() ? "" : "/" + key);
}

Status Bucket::check_access(const std::string& prefix) {
  Request r;
  r.query = "list-type=2&max-keys=1&prefix=" + query_value(prefix);
  return perform(r, "list").status();
}

Result<std::optional<std::uint64_t>> Bucket::size_of(const std::string& key) {
  SH_ASSIGN_OR_RETURN(auto info, head(key));
  if (!info) return std::optional<std::uint64_t>{};
  return std::optional<std::uint64_t>{info->size};
}

Result<std::optional<ObjectInfo>> Bucket::head(const std::string& key) {
  Request r;
  r.method = "HEAD";
  r.key = key;
  r.missing_ok = true;
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "HEAD"));
  if (response.http == 404) return std::optional<ObjectInfo>{};
  return std::optional<ObjectInfo>{ObjectInfo{key, response.content_length, response.etag}};
}

Result<std::optional<std::string>> Bucket::get(const std::string& key) {
  Request r;
  r.key = key;
  r.missing_ok = true;
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "GET"));
  if (response.http == 404) return std::optional<std::string>{};
  return std::optional<std::string>{std::move(response.body)};
}

Status Bucket::get_range(const std::string& key, std::uint64_t offset, std::size_t bytes,
                         void* dst) {
  if (bytes == 0) return Status::ok();
  Request r;
  r.key = key;
  r.dst = dst;
  r.dst_bytes = bytes;
  r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" +
                      std::to_string(offset + bytes - 1));
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "ranged GET"));
  if (response.received != bytes || (response.http != 206 && offset != 0)) {
    return Status{ErrorCode::corruption,
                  "'" + url(key) + "': asked for bytes " + std::to_string(offset) + "-" +
                      std::to_string(offset + bytes - 1) + ", got " +
                      std::to_string(response.received) + " (HTTP " +
                      std::to_string(response.http) + "; truncated object?)"};
  }
  return Status::ok();
}

Status Bucket::put(const std::string& key, std::string_view body) {
  Request r;
  r.method = "PUT";
  r.key = key;
  r.body = body;
  return perform(r, "PUT").status();
}

Result<std::vector<ObjectInfo>> Bucket::list(const std::string& prefix, std::size_t max_keys) {
  std::vector<ObjectInfo> out;
  std::string start_after;
  for (;;) {
    Request r;
    // Parameters in name order, as SigV4 signs them.
    r.query =
        "list-type=2" +
        (max_keys > 0 ? "&max-keys=" + std::to_string(max_keys - out.size()) : std::string()) +
        "&prefix=" + query_value(prefix) +
        (start_after.empty() ? "" : "&start-after=" + query_value(start_after));
    SH_ASSIGN_OR_RETURN(Response response, perform(r, "list"));
    pugi::xml_document doc;
    SH_ASSIGN_OR_RETURN(auto result, answer_root(doc, response.body, "ListBucketResult",
                                                 "list '" + url(prefix) + "'"));
    std::size_t before = out.size();
    for (auto c = result.child("Contents"); c; c = c.next_sibling("Contents")) {
      out.push_back({c.child_value("Key"), std::strtoull(c.child_value("Size"), nullptr, 10), {}});
    }
    bool truncated = std::string(result.child_value("IsTruncated")) == "true";
    if (!truncated || out.size() == before || (max_keys > 0 && out.size() >= max_keys)) break;
    start_after = out.back().key;
  }
  return out;
}

Status Bucket::remove(const std::string& key) {
  Request r;
  r.method = "DELETE";
  r.key = key;
  r.missing_ok = true;
  return perform(r, "DELETE").status();
}

Result<std::vector<MultipartUpload>> Bucket::open_uploads(const std::string& prefix) {
  std::vector<MultipartUpload> out;
  MultipartUpload marker;
  // S3 answers at most 1000 uploads at a time: follow the markers until it says no more.
  for (;;) {
    Request r;
    r.query = (marker.key.empty() ? "" : "key-marker=" + query_value(marker.key) + "&") +
              "prefix=" + query_value(prefix) +
              (marker.key.empty() ? "" : "&upload-id-marker=" + query_value(marker.upload_id)) +
              "&uploads=";
    SH_ASSIGN_OR_RETURN(Response response, perform(r, "list multipart uploads"));
    pugi::xml_document doc;
    SH_ASSIGN_OR_RETURN(auto result, answer_root(doc, response.body, "ListMultipartUploadsResult",
                                                 "list multipart uploads '" + url(prefix) + "'"));
    const std::size_t before = out.size();
    for (auto u = result.child("Upload"); u; u = u.next_sibling("Upload")) {
      out.push_back({u.child_value("Key"), u.child_value("UploadId")});
    }
    const bool truncated = std::string(result.child_value("IsTruncated")) == "true";
    MultipartUpload next{result.child_value("NextKeyMarker"),
                         result.child_value("NextUploadIdMarker")};
    if (!truncated || out.size() == before || next.key.empty()) break;
    marker = std::move(next);
  }
  return out;
}

Status Bucket::abort_upload(const MultipartUpload& upload) {
  Request r;
  r.method = "DELETE";
  r.key = upload.key;
  r.query = "uploadId=" + query_value(upload.upload_id);
  r.missing_ok = true;
  return perform(r, "abort multipart upload of").status();
}

}  // namespace stagehand
