#pragma once
// Internal to storage/: what the object-store client's files share (the request and response of
// one HTTP exchange, key and query encoding, XML answers). Not installed, not for other layers.

#include <curl/curl.h>

#include <cstdint>
#include <optional>
#include <pugixml.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "stagehand/storage/object_store.hpp"

namespace stagehand {

namespace s3 {

/// S3's smallest part (all but the last).
constexpr std::uint64_t kMinPartSize = 5ull << 20;
/// S3 allows at most this many parts per upload.
constexpr std::uint64_t kMaxParts = 10000;

/// "gs" or "s3".
const char* scheme_of(DestinationKind kind);

/// Letters, digits and -_.~/: the characters an object key may hold here (they need no escaping).
bool key_char_ok(char c);

/// URI-encodes a query parameter value as SigV4 canonicalizes it: every byte but A-Z a-z 0-9
/// -_.~ as %XX. (libcurl before 8.x signs the query exactly as given, so it must be given in
/// canonical form: encoded, and parameters sorted by name.)
std::string query_value(const std::string& value);

/// The element `root` of an XML answer; an error naming `what` when the body is not such a
/// document.
Result<pugi::xml_node> answer_root(pugi::xml_document& doc, const std::string& body,
                                   const char* root, const std::string& what);

}  // namespace s3

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

}  // namespace stagehand
