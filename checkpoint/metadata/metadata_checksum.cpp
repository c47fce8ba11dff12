#include "stagehand/checkpoint/metadata/metadata_json.hpp"

#include <bit>
#include <cstddef>
#include <cstring>

#include "stagehand/core/xxh3.hpp"

namespace stagehand {

namespace {

// JSON's whitespace is space, tab, line feed and carriage return; no other byte below 0x21 may
// stand outside a string (nor, unescaped, inside one), so in JSON text "a byte up to 0x20
// outside a string" is exactly its whitespace.
bool is_space_byte(char c) {
  return static_cast<unsigned char>(c) <= 0x20;
}

/// One past the quote that closes the string whose opening quote is at `open`; text.size()
/// when none does.
std::size_t string_end(std::string_view text, std::size_t open) {
  for (std::size_t i = open + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return text.size();
}

/// Hashes the compact text of `text` up to the end of its first top-level "checksum" member,
/// leaving out that member and the comma that separates it from a neighbour. Returns where it
/// stopped, outside any string: after the member's comma, at the brace that closes the top
/// level when the member is last, or text.size() when there is no such member.
std::size_t hash_up_to_checksum_end(std::string_view text, BufferedXxh3Stream& hash) {
  const char* const p = text.data();
  // [run, i) is text neither hashed nor dropped yet: hashed when whitespace or the checksum
  // member follows it, dropped when it is part of that member.
  std::size_t run = 0;
  int depth = 0;
  bool root_is_object = false;
  bool in_checksum = false;
  // In the top-level object: the next string is a member's key.
  bool key_next = false;
  // A comma between top-level members, hashed only once the member after it turns out not to be
  // the checksum.
  bool comma_held = false;
  std::size_t i = 0;
  while (i < text.size()) {
    if (is_space_byte(p[i])) {
      if (!in_checksum) hash.update(p + run, i - run);
      do {
        ++i;
      } while (i < text.size() && is_space_byte(p[i]));
      run = i;
      continue;
    }
    switch (p[i]) {
      case '"': {
        const std::size_t end = string_end(text, i);
        if (key_next && depth == 1) {
          key_next = false;
          if (text.substr(i, end - i) == "\"checksum\"") {
            hash.update(p + run, i - run);
            run = i;
            in_checksum = true;
          } else if (comma_held) {
            hash.update(',');
            comma_held = false;
          }
        }
        i = end;
        continue;
      }
      case ',':
        if (depth == 1 && root_is_object) {
          if (in_checksum) {
            // The comma after the member goes with it; the one before it, if any, stays.
            if (comma_held) hash.update(',');
            return i + 1;
          }
          hash.update(p + run, i - run);
          comma_held = true;
          key_next = true;
          run = ++i;
          continue;
        }
        break;
      case '{':
      case '[':
        if (depth++ == 0) key_next = root_is_object = p[i] == '{';
        break;
      case '}':
      case ']':
        // A checksum member that comes last takes the comma before it along.
        if (depth-- == 1 && in_checksum) return i;
        break;
      default:
        break;
    }
    ++i;
  }
  if (!in_checksum) hash.update(p + run, text.size() - run);
  return text.size();
}

// -- whitespace outside strings, eight bytes at a time --

constexpr std::uint64_t kEachByte = 0x0101010101010101;
constexpr std::uint64_t kHighBits = 0x8080808080808080;

/// The high bit of each byte of `word` that equals `c`.
std::uint64_t bytes_equal(std::uint64_t word, char c) {
  const std::uint64_t x = word ^ (kEachByte * static_cast<unsigned char>(c));
  return ~(((x & ~kHighBits) + ~kHighBits) | x) & kHighBits;
}

/// The high bit of each byte of `word` up to 0x20.
std::uint64_t space_bytes(std::uint64_t word) {
  return ~(((word & ~kHighBits) + kEachByte * (0x80 - 0x21)) | word) & kHighBits;
}

/// The eight bytes at `p` with the first in the lowest byte, whatever the machine's order.
std::uint64_t load_word(const char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
  return word;
}

/// Copies `text` into `out` less its whitespace outside strings, one byte at a time, carrying
/// whether a string and an escape in it are open; returns the bytes written.
std::size_t compact_bytes(std::string_view text, char* out, bool& in_string, bool& escaped) {
  std::size_t k = 0;
  for (char c : text) {
    out[k] = c;
    if (escaped) {
      escaped = false;
      ++k;
    } else if (in_string) {
      escaped = c == '\\';
      in_string = c != '"';
      ++k;
    } else {
      in_string = c == '"';
      k += !is_space_byte(c);
    }
  }
  return k;
}

/// Hashes `text` less its whitespace outside strings. @pre text starts outside a string
void hash_without_spaces(std::string_view text, BufferedXxh3Stream& hash) {
  constexpr std::size_t kBlock = 4096;
  char out[kBlock];
  bool in_string = false;
  bool escaped = false;
  for (std::size_t block = 0; block < text.size(); block += kBlock) {
    const std::string_view in = text.substr(block, kBlock);
    std::size_t k = 0;
    std::size_t i = 0;
    for (; i + 8 <= in.size(); i += 8) {
      const std::uint64_t word = load_word(in.data() + i);
      if (escaped || bytes_equal(word, '\\') != 0) {
        // Rare: an escape changes which quotes open and close strings.
        k += compact_bytes(in.substr(i, 8), out + k, in_string, escaped);
        continue;
      }
      // A byte is inside a string (or opens one) when an odd number of quotes opened or closed
      // strings up to it.
      std::uint64_t quotes = bytes_equal(word, '"');
      quotes ^= quotes << 8;
      quotes ^= quotes << 16;
      quotes ^= quotes << 32;
      const std::uint64_t inside = quotes ^ (kHighBits * in_string);
      const std::uint64_t dropped = space_bytes(word) & ~inside;
      in_string = inside >> 63;
      if (dropped == 0) {
        std::memcpy(out + k, in.data() + i, 8);
        k += 8;
        continue;
      }
      for (std::size_t j = 0; j < 8; ++j) {
        out[k] = in[i + j];
        k += ((dropped >> (8 * j + 7)) & 1) ^ 1;
      }
    }
    k += compact_bytes(in.substr(i), out + k, in_string, escaped);
    hash.update(out, k);
  }
}

}  // namespace

std::uint64_t metadata_text_checksum(std::string_view text) {
  BufferedXxh3Stream hash;
  // The writer puts the checksum first, so the rest, all of it hashed, goes the fast way.
  const std::size_t rest = hash_up_to_checksum_end(text, hash);
  hash_without_spaces(text.substr(rest), hash);
  return hash.digest();
}

}  // namespace stagehand
