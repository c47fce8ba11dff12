#include "strategy/object_store.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <pugixml.hpp>
#include <random>
#include <thread>

#include "config/config.hpp"
#include "strategy/storage.hpp"

namespace stagehand {

namespace {

constexpr std::uint64_t kMinPartSize = 5ull << 20;
/// S3 allows at most this many parts per upload.
constexpr std::uint64_t kMaxParts = 10000;

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

const char* scheme_of(DestinationKind kind) { return kind == DestinationKind::gcs ? "gs" : "s3"; }

bool key_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~' || c == '/';
}

/// URI-encodes a query parameter value as SigV4 canonicalizes it: every byte but A-Z a-z 0-9
/// -_.~ as %XX. (libcurl before 8.x signs the query exactly as given, so it must be given in
/// canonical form: encoded, and parameters sorted by name.)
std::string query_value(const std::string& value) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (char c : value) {
    if (key_char_ok(c) && c != '/') {
      out.push_back(c);
    } else {
      auto b = static_cast<unsigned char>(c);
      out += {'%', kHex[b >> 4], kHex[b & 15]};
    }
  }
  return out;
}

/// libcurl's process-wide state, set up once before the first handle.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

/// One easy handle per thread, so that each thread reuses its connections.
struct ThreadCurl {
  CURL* handle = nullptr;
  ThreadCurl() : handle(curl_easy_init()) {}
  ~ThreadCurl() {
    if (handle != nullptr) curl_easy_cleanup(handle);
  }
  ThreadCurl(const ThreadCurl&) = delete;
  ThreadCurl& operator=(const ThreadCurl&) = delete;
};

CURL* thread_curl() {
  init_curl_once();
  thread_local ThreadCurl curl;
  if (curl.handle != nullptr) curl_easy_reset(curl.handle);
  return curl.handle;
}

/// The body of a PUT, read from memory or from a region of a file.
struct UploadSource {
  const char* memory = nullptr;
  int fd = -1;
  std::uint64_t offset = 0;
  std::uint64_t remaining = 0;
  int read_errno = 0;
};

std::size_t read_upload(char* buffer, std::size_t size, std::size_t count, void* user) {
  auto* src = static_cast<UploadSource*>(user);
  std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size * count, src->remaining));
  if (n == 0) return 0;
  if (src->memory != nullptr) {
    std::memcpy(buffer, src->memory + src->offset, n);
  } else {
    ssize_t got = ::pread(src->fd, buffer, n, static_cast<off_t>(src->offset));
    if (got <= 0) {
      src->read_errno = got < 0 ? errno : EIO;
      return CURL_READFUNC_ABORT;
    }
    n = static_cast<std::size_t>(got);
  }
  src->offset += n;
  src->remaining -= n;
  return n;
}

/// Where a response body goes: a string, or a fixed buffer that must not overflow.
struct DownloadSink {
  std::string* text = nullptr;
  std::uint8_t* buffer = nullptr;
  std::size_t capacity = 0;
  std::size_t received = 0;
};

std::size_t write_download(char* data, std::size_t size, std::size_t count, void* user) {
  auto* sink = static_cast<DownloadSink*>(user);
  std::size_t n = size * count;
  if (sink->buffer != nullptr && sink->received + n > sink->capacity) {
    // An error answer's body is small: keep it for the message instead of the buffer.
    if (sink->text == nullptr) return 0;
    sink->text->append(data, n);
  } else if (sink->buffer != nullptr) {
    std::memcpy(sink->buffer + sink->received, data, n);
  } else if (sink->text != nullptr) {
    sink->text->append(data, n);
  }
  sink->received += n;
  return n;
}

std::size_t read_header(char* data, std::size_t size, std::size_t count, void* user) {
  std::size_t n = size * count;
  if (n > 5 && strncasecmp(data, "etag:", 5) == 0) {
    std::string_view value(data + 5, n - 5);
    auto first = value.find_first_not_of(" \t");
    auto last = value.find_last_not_of(" \t\r\n");
    *static_cast<std::string*>(user) =
        first == std::string_view::npos ? "" : std::string(value.substr(first, last - first + 1));
  }
  return n;
}

bool transient_curl_error(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool transient_s3_code(const std::string& code) {
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable" ||
         code == "Throttling" || code == "ThrottlingException" || code == "RequestLimitExceeded";
}

bool transient_http(long http) { return http == 408 || http == 429 || http >= 500; }

/// The Code and Message of an S3 error document; empty when the body is not one.
std::pair<std::string, std::string> s3_error(const std::string& body) {
  pugi::xml_document doc;
  if (body.empty() || !doc.load_buffer(body.data(), body.size())) return {};
  auto error = doc.child("Error");
  if (!error) return {};
  return {error.child_value("Code"), error.child_value("Message")};
}

/// The element `root` of an XML answer; an error naming `what` when the body is not such a document.
Result<pugi::xml_node> answer_root(pugi::xml_document& doc, const std::string& body, const char* root,
                                   const std::string& what) {
  if (!doc.load_buffer(body.data(), body.size()) || !doc.child(root)) {
    return Status{ErrorCode::io_error, what + ": the answer is not a " + root + " document"};
  }
  return doc.child(root);
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

ObjectStoreOptions ObjectStoreOptions::from_config(const S3Config& config) {
  ObjectStoreOptions o = from_environment();
  if (!config.endpoint.empty()) o.endpoint = config.endpoint;
  if (!config.region.empty()) o.region = config.region;
  o.path_style = config.path_style;
  o.max_attempts = static_cast<int>(config.max_attempts);
  o.multipart_threshold = static_cast<std::uint64_t>(config.multipart_threshold_mib) << 20;
  o.part_size = static_cast<std::uint64_t>(config.part_size_mib) << 20;
  o.upload_threads = static_cast<int>(config.upload_threads);
  return o;
}

// -- URLs --

Result<ObjectUrl> ObjectUrl::parse(const std::string& url) {
  ObjectUrl out;
  out.kind = classify_destination(url);
  if (out.kind == DestinationKind::local) {
    return Status{ErrorCode::invalid_argument, "'" + url + "' is not an object-store URL (s3://, gs://)"};
  }
  std::string rest = url.substr(url.find("://") + 3);
  auto slash = rest.find('/');
  out.bucket = rest.substr(0, slash);
  std::string key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!key.empty() && key.back() == '/') key.pop_back();
  if (out.bucket.size() < 3 || out.bucket.size() > 63 ||
      !std::all_of(out.bucket.begin(), out.bucket.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
      })) {
    return Status{ErrorCode::invalid_argument,
                  "'" + url + "': bucket name '" + out.bucket + "' must be 3-63 lowercase letters, digits, '-', '.'"};
  }
  for (char c : key) {
    if (!key_char_ok(c)) {
      return Status{ErrorCode::invalid_argument, "'" + url + "': the character '" + std::string(1, c) +
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

std::string ObjectUrl::key_of(const std::string& rel) const { return key.empty() ? rel : key + "/" + rel; }

// -- bucket --

struct Bucket::Request {
  const char* method = "GET";
  std::string key;
  /// Already in canonical form: parameters sorted by name, values without characters to escape.
  std::string query;
  std::vector<std::string> headers;
  /// PUT or POST body from memory.
  std::optional<std::string_view> body;
  /// PUT body from a file region.
  int fd = -1;
  std::uint64_t file_offset = 0;
  std::uint64_t file_bytes = 0;
  /// GET into a buffer of exactly this many bytes.
  void* dst = nullptr;
  std::size_t dst_bytes = 0;
  /// A 404 for the object is an answer, not an error.
  bool missing_ok = false;
};

struct Bucket::Response {
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  long http = 0;
  std::string body;
  std::string etag;
  std::size_t received = 0;
  std::uint64_t content_length = 0;
  int read_errno = 0;
};

Result<std::shared_ptr<Bucket>> Bucket::open(DestinationKind kind, std::string bucket, ObjectStoreOptions options) {
  std::string where = std::string(scheme_of(kind)) + "://" + bucket;
  if (options.access_key_id.empty() || options.secret_access_key.empty()) {
    return Status{ErrorCode::permission_denied,
                  "no credentials for '" + where + "': set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" +
                      (kind == DestinationKind::gcs ? " to a Cloud Storage HMAC key" : "")};
  }
  if (options.region.empty()) options.region = kind == DestinationKind::gcs ? "auto" : "us-east-1";
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) {
    endpoint = kind == DestinationKind::gcs ? "https://storage.googleapis.com"
                                            : "https://s3." + options.region + ".amazonaws.com";
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0) {
    return Status{ErrorCode::config_error,
                  "object-store endpoint '" + endpoint + "' must start with http:// or https://"};
  }
  if (options.max_attempts < 1 || options.upload_threads < 1) {
    return Status{ErrorCode::config_error, "object-store max_attempts and upload_threads must be at least 1"};
  }
  if (options.part_size < kMinPartSize || options.multipart_threshold < options.part_size) {
    return Status{ErrorCode::config_error,
                  "object-store part size must be at least 5 MiB and at most the multipart threshold"};
  }
  return std::shared_ptr<Bucket>(new Bucket(kind, std::move(bucket), std::move(options), std::move(endpoint)));
}

Bucket::Bucket(DestinationKind kind, std::string bucket, ObjectStoreOptions options, std::string endpoint)
    : kind_(kind),
      bucket_(std::move(bucket)),
      options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      sigv4_("aws:amz:" + options_.region + ":s3") {}

std::string Bucket::url(const std::string& key) const {
  return std::string(scheme_of(kind_)) + "://" + bucket_ + (key.empty() ? "" : "/" + key);
}

std::string Bucket::request_url(const std::string& key, const std::string& query) const {
  std::string base;
  if (options_.path_style) {
    base = endpoint_ + "/" + bucket_;
  } else {
    auto host_start = endpoint_.find("://") + 3;
    base = endpoint_.substr(0, host_start) + bucket_ + "." + endpoint_.substr(host_start);
  }
  if (!key.empty()) base += "/" + key;
  if (!query.empty()) base += "?" + query;
  return base;
}

Result<Bucket::Response> Bucket::perform_once(const Request& request) {
  CURL* curl = thread_curl();
  if (curl == nullptr) return Status{ErrorCode::internal, "cannot create a libcurl handle"};
  Response response;
  char error_buffer[CURL_ERROR_SIZE] = {0};
  std::string url = request_url(request.key, request.query);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, options_.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, options_.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, options_.connect_timeout_s);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, options_.stall_timeout_s);

  curl_slist* headers = nullptr;
  // Payloads are not hashed into the signature (our own XXH3 checksums guard the bytes).
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  std::string token_header;
  if (!options_.session_token.empty()) {
    token_header = "x-amz-security-token: " + options_.session_token;
    headers = curl_slist_append(headers, token_header.c_str());
  }
  for (const auto& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  UploadSource upload;
  std::string method = request.method;
  if (method == "PUT") {
    if (request.body) {
      upload.memory = request.body->data();
      upload.remaining = request.body->size();
    } else {
      upload.fd = request.fd;
      upload.offset = request.file_offset;
      upload.remaining = request.file_bytes;
    }
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(upload.remaining));
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_upload);
    curl_easy_setopt(curl, CURLOPT_READDATA, &upload);
  } else if (method == "POST") {
    std::string_view body = request.body.value_or(std::string_view{});
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  } else if (method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method);
  }

  DownloadSink sink;
  sink.text = &response.body;
  if (request.dst != nullptr) {
    sink.buffer = static_cast<std::uint8_t*>(request.dst);
    sink.capacity = request.dst_bytes;
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_download);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, read_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.etag);

  response.curl = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (response.curl != CURLE_OK) {
    response.curl_error = error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(response.curl);
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.http);
  curl_off_t length = -1;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  response.content_length = length > 0 ? static_cast<std::uint64_t>(length) : 0;
  response.received = request.dst != nullptr && response.http / 100 == 2 ? sink.received : 0;
  response.read_errno = upload.read_errno;
  return response;
}

Result<Bucket::Response> Bucket::perform(const Request& request, const std::string& what) {
  std::string target = url(request.key);
  std::string context = what + " '" + target + "' at " + endpoint_;
  thread_local std::minstd_rand jitter(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    SH_ASSIGN_OR_RETURN(Response r, perform_once(request));
    bool retry = false;
    Status failure;
    if (r.read_errno != 0) {
      return Status::from_errno(r.read_errno, context + ": cannot read the local file being uploaded");
    }
    if (r.curl != CURLE_OK) {
      retry = transient_curl_error(r.curl);
      bool unreachable = r.curl == CURLE_COULDNT_CONNECT || r.curl == CURLE_COULDNT_RESOLVE_HOST;
      failure = Status{ErrorCode::io_error, unreachable ? "cannot reach the object store at " + endpoint_ + " (" +
                                                              r.curl_error + ") for " + what + " '" + target + "'"
                                                        : context + ": " + r.curl_error};
    } else {
      auto [code, message] = s3_error(r.body);
      bool ok = r.http / 100 == 2 && code.empty();
      if (ok) return r;
      std::string answer = "HTTP " + std::to_string(r.http) + (code.empty() ? "" : " " + code) +
                           (message.empty() ? "" : ": " + message);
      if (code == "NoSuchBucket") {
        return Status{ErrorCode::not_found,
                      "bucket '" + bucket_ + "' does not exist at " + endpoint_ + " (" + what + " '" + target + "')"};
      }
      if (r.http == 404 && request.missing_ok) return r;
      if (r.http == 403 || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
          code == "AccessDenied" || code == "ExpiredToken" || code == "InvalidToken") {
        return Status{ErrorCode::permission_denied,
                      context + ": " + answer +
                          " (check the credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)"};
      }
      if (r.http == 404) return Status{ErrorCode::not_found, context + ": " + answer};
      retry = transient_http(r.http) || transient_s3_code(code);
      failure = Status{ErrorCode::io_error, context + ": " + answer};
    }
    if (!retry) return failure;
    if (attempt >= options_.max_attempts) {
      return Status{failure.code(),
                    failure.message() + " (gave up after " + std::to_string(attempt) + " attempts)"};
    }
    double ceiling = std::min(options_.max_backoff_s, options_.initial_backoff_s * double(1ull << (attempt - 1)));
    std::uniform_real_distribution<double> pick(ceiling / 2, ceiling);
    std::this_thread::sleep_for(std::chrono::duration<double>(pick(jitter)));
  }
}

Status Bucket::check_access(const std::string& prefix) {
  Request r;
  r.query = "list-type=2&max-keys=1&prefix=" + query_value(prefix);
  return perform(r, "list").status();
}

Result<std::optional<std::uint64_t>> Bucket::size_of(const std::string& key) {
  Request r;
  r.method = "HEAD";
  r.key = key;
  r.missing_ok = true;
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "HEAD"));
  if (response.http == 404) return std::optional<std::uint64_t>{};
  return std::optional<std::uint64_t>{response.content_length};
}

Result<std::optional<std::string>> Bucket::get(const std::string& key) {
  Request r;
  r.key = key;
  r.missing_ok = true;
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "GET"));
  if (response.http == 404) return std::optional<std::string>{};
  return std::optional<std::string>{std::move(response.body)};
}

Status Bucket::get_range(const std::string& key, std::uint64_t offset, std::size_t bytes, void* dst) {
  if (bytes == 0) return Status::ok();
  Request r;
  r.key = key;
  r.dst = dst;
  r.dst_bytes = bytes;
  r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + bytes - 1));
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "ranged GET"));
  if (response.received != bytes || (response.http != 206 && offset != 0)) {
    return Status{ErrorCode::corruption, "'" + url(key) + "': asked for bytes " + std::to_string(offset) + "-" +
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

Result<std::vector<ObjectInfo>> Bucket::list(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::string start_after;
  for (;;) {
    Request r;
    r.query = "list-type=2&prefix=" + query_value(prefix) +
              (start_after.empty() ? "" : "&start-after=" + query_value(start_after));
    SH_ASSIGN_OR_RETURN(Response response, perform(r, "list"));
    pugi::xml_document doc;
    SH_ASSIGN_OR_RETURN(auto result, answer_root(doc, response.body, "ListBucketResult", "list '" + url(prefix) + "'"));
    std::size_t before = out.size();
    for (auto c = result.child("Contents"); c; c = c.next_sibling("Contents")) {
      out.push_back({c.child_value("Key"), std::strtoull(c.child_value("Size"), nullptr, 10)});
    }
    bool truncated = std::string(result.child_value("IsTruncated")) == "true";
    if (!truncated || out.size() == before) break;
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
  Request r;
  r.query = "prefix=" + query_value(prefix) + "&uploads=";
  SH_ASSIGN_OR_RETURN(Response response, perform(r, "list multipart uploads"));
  pugi::xml_document doc;
  SH_ASSIGN_OR_RETURN(auto result, answer_root(doc, response.body, "ListMultipartUploadsResult",
                                               "list multipart uploads '" + url(prefix) + "'"));
  std::vector<MultipartUpload> out;
  for (auto u = result.child("Upload"); u; u = u.next_sibling("Upload")) {
    out.push_back({u.child_value("Key"), u.child_value("UploadId")});
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

Status Bucket::upload_files(const std::vector<FileUpload>& files) {
  struct OpenFile {
    ReadOnlyFile file;
    std::uint64_t size;
    std::optional<MultipartUpload> multipart;
    std::vector<std::string> etags;
  };
  struct Task {
    std::size_t file;
    /// 1-based part number; 0 for a single PUT.
    std::uint64_t part;
    std::uint64_t offset;
    std::uint64_t bytes;
  };
  std::vector<OpenFile> open;
  std::vector<Task> tasks;
  Status failed;
  auto abort_begun = [&]() {
    std::string left_open;
    for (auto& f : open) {
      if (!f.multipart) continue;
      Status aborted = abort_upload(*f.multipart);
      if (!aborted.is_ok()) left_open += "; multipart upload " + f.multipart->upload_id + " of '" +
                                         url(f.multipart->key) + "' is left open: " + aborted.message();
    }
    return left_open;
  };
  for (std::size_t i = 0; i < files.size(); ++i) {
    auto file = ReadOnlyFile::open(files[i].local_path);
    if (!file.is_ok()) {
      failed = file.status();
      break;
    }
    auto size = file_size(files[i].local_path);
    if (!size.is_ok()) {
      failed = size.status();
      break;
    }
    open.push_back({std::move(*file), *size, std::nullopt, {}});
    if (*size < options_.multipart_threshold) {
      tasks.push_back({i, 0, 0, *size});
      continue;
    }
    std::uint64_t part_size = std::max(options_.part_size, (*size + kMaxParts - 1) / kMaxParts);
    Request initiate;
    initiate.method = "POST";
    initiate.key = files[i].key;
    initiate.query = "uploads=";
    auto response = perform(initiate, "begin multipart upload of");
    if (!response.is_ok()) {
      failed = response.status();
      break;
    }
    pugi::xml_document doc;
    const std::string what = "begin multipart upload of '" + url(files[i].key) + "'";
    auto result = answer_root(doc, response->body, "InitiateMultipartUploadResult", what);
    std::string id = result.is_ok() ? result->child_value("UploadId") : "";
    if (id.empty()) {
      failed = result.is_ok() ? Status{ErrorCode::io_error, what + ": no UploadId in the answer"} : result.status();
      break;
    }
    open.back().multipart = MultipartUpload{files[i].key, id};
    std::uint64_t parts = (*size + part_size - 1) / part_size;
    open.back().etags.resize(parts);
    for (std::uint64_t p = 0; p < parts; ++p) {
      tasks.push_back({i, p + 1, p * part_size, std::min(part_size, *size - p * part_size)});
    }
  }
  if (!failed.is_ok()) return Status{failed.code(), failed.message() + abort_begun()};

  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  auto work = [&] {
    for (std::size_t t; !stop.load() && (t = next.fetch_add(1)) < tasks.size();) {
      const Task& task = tasks[t];
      OpenFile& f = open[task.file];
      Request put;
      put.method = "PUT";
      put.key = files[task.file].key;
      put.fd = f.file.fd();
      put.file_offset = task.offset;
      put.file_bytes = task.bytes;
      if (task.part > 0) {
        put.query = "partNumber=" + std::to_string(task.part) + "&uploadId=" + query_value(f.multipart->upload_id);
      }
      auto response = perform(put, task.part > 0 ? "upload part " + std::to_string(task.part) + " of" : "PUT");
      std::lock_guard<std::mutex> lock(mutex);
      if (!response.is_ok()) {
        if (failed.is_ok()) failed = response.status();
        stop = true;
      } else if (task.part > 0) {
        f.etags[task.part - 1] = response->etag;
      }
    }
  };
  std::vector<std::thread> threads;
  std::size_t thread_count = std::min<std::size_t>(static_cast<std::size_t>(options_.upload_threads), tasks.size());
  for (std::size_t i = 1; i < thread_count; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();

  for (std::size_t i = 0; i < open.size() && failed.is_ok(); ++i) {
    OpenFile& f = open[i];
    if (!f.multipart) continue;
    std::string body = "<CompleteMultipartUpload>";
    for (std::size_t p = 0; p < f.etags.size(); ++p) {
      body += "<Part><PartNumber>" + std::to_string(p + 1) + "</PartNumber><ETag>" + f.etags[p] + "</ETag></Part>";
    }
    body += "</CompleteMultipartUpload>";
    Request complete;
    complete.method = "POST";
    complete.key = f.multipart->key;
    complete.query = "uploadId=" + query_value(f.multipart->upload_id);
    complete.body = body;
    complete.headers.push_back("Content-Type: application/xml");
    auto response = perform(complete, "complete multipart upload of");
    if (!response.is_ok()) {
      failed = response.status();
      break;
    }
    f.multipart.reset();
  }
  if (!failed.is_ok()) return Status{failed.code(), failed.message() + abort_begun()};
  return Status::ok();
}

}  // namespace stagehand
