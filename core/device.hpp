#pragma once

#include <cstddef>
#include <string>

namespace stagehand {

/// Where a tensor's bytes live.
enum class DeviceKind { host, cuda };

/// A memory location: host memory, or one CUDA device.
struct Device {
  DeviceKind kind = DeviceKind::host;
  int index = 0;

  static Device host() { return {}; }
  static Device cuda(int index) { return {DeviceKind::cuda, index}; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  std::string to_string() const;
  friend bool operator==(const Device&, const Device&) = default;
};

/// What the process can use, detected once.
struct DeviceInfo {
  /// True when the CUDA runtime was compiled in.
  bool cuda_compiled = false;
  /// Number of visible, usable GPUs (0 when none, or when STAGEHAND_FORCE_HOST=1).
  int gpu_count = 0;
  /// Why no GPU is used, when gpu_count is 0 ("no GPU visible: cudaGetDeviceCount ...").
  std::string reason;
  /// STAGEHAND_SIMULATED_GPU=1 (and not STAGEHAND_FORCE_HOST=1): gpu_count is 1, a simulated
  /// device (copy_engine.hpp) whose memory is host memory allocated through it; copies to and
  /// from it take time and are checked.
  bool simulated = false;
};

/// Detects GPUs once per process. Thread-safe.
const DeviceInfo& device_info();

/// The device a rank computes on: its GPU (local_rank modulo the GPU count) when one is
/// visible, host memory otherwise.
Device default_device(int local_rank);

// -- raw memory, used by tensors and staging buffers --

/// Allocates `bytes` on `device` (4096-byte aligned on the host). nullptr on failure.
void* device_alloc(Device device, std::size_t bytes);
void device_free(Device device, void* ptr);

/// Allocates page-locked host memory when a GPU is in use, else aligned host memory.
void* host_alloc(std::size_t bytes, bool pinned);
void host_free(void* ptr, bool pinned);

/// Copies `bytes` between host memory and `device` (plain memcpy for host memory; through
/// copy_engine() for a simulated GPU).
/// @return false when the CUDA runtime reported an error.
bool copy_to_host(Device src_device, const void* src, void* dst, std::size_t bytes);
bool copy_from_host(Device dst_device, const void* src, void* dst, std::size_t bytes);

}  // namespace stagehand
