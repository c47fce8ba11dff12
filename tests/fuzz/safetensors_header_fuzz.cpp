// Fuzzes parse_safetensors_header. The input is the start of a data file, which goes on with
// zeros for kTail more bytes so that data_offsets may point past the input. What the parser
// accepts must keep its promises and survive a round trip through make_safetensors_header.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"

using namespace stagehand;

namespace {

constexpr std::uint64_t kTail = 64u << 10;

/// Elements of a shape the parser accepted (Shape::numel may overflow before a later 0).
std::uint64_t elements(const Shape& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape.dims()) {
    if (d == 0) return 0;
  }
  for (std::int64_t d : shape.dims()) {
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

Result<ParsedSafetensors> parse(const std::uint8_t* data, std::size_t size,
                                std::uint64_t file_size) {
  return parse_safetensors_header(
      [&](std::uint64_t offset, void* dst, std::size_t bytes) -> Status {
        if (offset > file_size || bytes > file_size - offset) {
          return {ErrorCode::corruption, "read past the end of the file"};
        }
        auto* out = static_cast<std::uint8_t*>(dst);
        std::size_t from_input =
            offset < size ? static_cast<std::size_t>(std::min<std::uint64_t>(bytes, size - offset))
                          : 0;
        if (from_input > 0) std::memcpy(out, data + offset, from_input);
        std::memset(out + from_input, 0, bytes - from_input);
        return Status::ok();
      },
      file_size, "fuzz.safetensors");
}

void keeps_its_promises(const ParsedSafetensors& parsed, std::uint64_t file_size) {
  if (parsed.data_start > file_size) __builtin_trap();
  for (std::size_t i = 0; i < parsed.entries.size(); ++i) {
    const SafetensorsEntry& e = parsed.entries[i];
    if (i > 0 && !(parsed.entries[i - 1].key < e.key)) __builtin_trap();
    if (e.begin > e.end || e.end > file_size - parsed.data_start) __builtin_trap();
    if (e.end - e.begin != elements(e.shape) * dtype_size(e.dtype)) __builtin_trap();
    if (parsed.find(e.key) != &e) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t file_size = size + kTail;
  auto parsed = parse(data, size, file_size);
  if (!parsed.is_ok()) return 0;
  keeps_its_promises(*parsed, file_size);
  std::uint64_t data_bytes = 0;
  for (const auto& e : parsed->entries) {
    data_bytes = std::max(data_bytes, e.end);
  }
  const std::string header = make_safetensors_header(parsed->entries);
  const std::uint64_t again_size = header.size() + data_bytes;
  auto again =
      parse(reinterpret_cast<const std::uint8_t*>(header.data()), header.size(), again_size);
  if (!again.is_ok() || again->entries.size() != parsed->entries.size()) __builtin_trap();
  for (std::size_t i = 0; i < again->entries.size(); ++i) {
    const SafetensorsEntry& a = parsed->entries[i];
    const SafetensorsEntry& b = again->entries[i];
    if (a.key != b.key || a.dtype != b.dtype || !(a.shape == b.shape) || a.begin != b.begin ||
        a.end != b.end) {
      __builtin_trap();
    }
  }
  return 0;
}
