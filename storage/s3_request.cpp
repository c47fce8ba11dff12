#include <curl/curl.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "stagehand/storage/s3_request.hpp"

// One HTTP exchange with an object store: libcurl's built-in AWS Signature V4 signs it, and
// perform() retries what can succeed on a second try.

namespace stagehand {

namespace s3 {

const char* scheme_of(DestinationKind kind) {
  return kind == DestinationKind::gcs ? "gs" : "s3";
}

bool key_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~' || c == '/';
}

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

Result<pugi::xml_node> answer_root(pugi::xml_document& doc, const std::string& body,
                                   const char* root, const std::string& what) {
  if (!doc.load_buffer(body.data(), body.size()) || !doc.child(root)) {
    return Status{ErrorCode::io_error, what + ": the answer is not a " + root + " document"};
  }
  return doc.child(root);
}

}  // namespace s3

namespace {

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
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" ||
         code == "ServiceUnavailable" || code == "Throttling" || code == "ThrottlingException" ||
         code == "RequestLimitExceeded";
}

bool transient_http(long http) {
  return http == 408 || http == 429 || http >= 500;
}

/// The Code and Message of an S3 error document; empty when the body is not one.
std::pair<std::string, std::string> s3_error(const std::string& body) {
  pugi::xml_document doc;
  if (body.empty() || !doc.load_buffer(body.data(), body.size())) return {};
  auto error = doc.child("Error");
  if (!error) return {};
  return {error.child_value("Code"), error.child_value("Message")};
}

}  // namespace

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
  for (const auto& h : request.headers)
    headers = curl_slist_append(headers, h.c_str());
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
    response.curl_error =
        error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(response.curl);
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
      return Status::from_errno(r.read_errno,
                                context + ": cannot read the local file being uploaded");
    }
    if (r.curl != CURLE_OK) {
      retry = transient_curl_error(r.curl);
      bool unreachable = r.curl == CURLE_COULDNT_CONNECT || r.curl == CURLE_COULDNT_RESOLVE_HOST;
      failure = Status{ErrorCode::io_error, unreachable ? "cannot reach the object store at " +
                                                              endpoint_ + " (" + r.curl_error +
                                                              ") for " + what + " '" + target + "'"
                                                        : context + ": " + r.curl_error};
    } else {
      auto [code, message] = s3_error(r.body);
      bool ok = r.http / 100 == 2 && code.empty();
      if (ok) return r;
      std::string answer = "HTTP " + std::to_string(r.http) + (code.empty() ? "" : " " + code) +
                           (message.empty() ? "" : ": " + message);
      if (code == "NoSuchBucket") {
        return Status{ErrorCode::not_found, "bucket '" + bucket_ + "' does not exist at " +
                                                endpoint_ + " (" + what + " '" + target + "')"};
      }
      if (r.http == 404 && request.missing_ok) return r;
      if (r.http == 403 || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
          code == "AccessDenied" || code == "ExpiredToken" || code == "InvalidToken") {
        return Status{ErrorCode::permission_denied,
                      context + ": " + answer +
                          " (check the credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                          "AWS_SESSION_TOKEN)"};
      }
      if (r.http == 404) return Status{ErrorCode::not_found, context + ": " + answer};
      retry = transient_http(r.http) || transient_s3_code(code);
      failure = Status{ErrorCode::io_error, context + ": " + answer};
    }
    if (!retry) return failure;
    if (attempt >= options_.max_attempts) {
      return Status{failure.code(), failure.message() + " (gave up after " +
                                        std::to_string(attempt) + " attempts)"};
    }
    double ceiling = std::min(options_.max_backoff_s,
                              options_.initial_backoff_s * double(1ull << (attempt - 1)));
    std::uniform_real_distribution<double> pick(ceiling / 2, ceiling);
    std::this_thread::sleep_for(std::chrono::duration<double>(pick(jitter)));
  }
}

}  // namespace stagehand
