#include "stagehand/core/xxh3.hpp"

#include <xxhash.h>
#if STAGEHAND_XXH3_DISPATCH
// Replaces XXH3_64bits and XXH3_64bits_update with versions that use the widest vector unit this
// CPU has (the digests are the same by XXH3's definition; core_test checks them against the
// scalar code).
#include <xxh_x86dispatch.h>
#endif

#include <cstdio>

namespace stagehand {

std::uint64_t xxh3(const void* data, std::size_t bytes) {
  return XXH3_64bits(data, bytes);
}

std::string xxh3_hex(std::uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::optional<std::uint64_t> parse_xxh3_hex(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value << 4 | static_cast<std::uint64_t>(digit);
  }
  return value;
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::update(const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

std::uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::reset() {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

}  // namespace stagehand
