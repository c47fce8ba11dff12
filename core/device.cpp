#include "stagehand/core/device.hpp"

#include "stagehand/core/copy_engine.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#ifdef STAGEHAND_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stagehand {

namespace {

constexpr std::size_t kHostAlignment = 4096;
/// Large host buffers are aligned to and advised as transparent huge pages: first-touch page
/// faults are what makes a fresh staging buffer slow to fill.
constexpr std::size_t kHugePage = 2u << 20;

DeviceInfo detect() {
  DeviceInfo info;
#ifdef STAGEHAND_HAVE_CUDA
  info.cuda_compiled = true;
#endif
  // Host memory when asked, whatever else is there: a real GPU or the simulated one.
  const char* force_host = std::getenv("STAGEHAND_FORCE_HOST");
  if (force_host != nullptr && std::strcmp(force_host, "1") == 0) {
    info.reason = "STAGEHAND_FORCE_HOST=1";
    return info;
  }
  if (simulated_gpu_requested()) {
    info.simulated = true;
    info.gpu_count = 1;
    return info;
  }
#ifdef STAGEHAND_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.reason = std::string("no GPU visible: cudaGetDeviceCount failed with error ") +
                  std::to_string(static_cast<int>(err)) + " (" + cudaGetErrorString(err) + ")";
    return info;
  }
  if (count == 0) {
    info.reason = "no GPU visible: cudaGetDeviceCount returned 0";
    return info;
  }
  info.gpu_count = count;
#else
  info.reason = "CUDA was not compiled in";
#endif
  return info;
}

bool simulated() { return device_info().simulated; }

}  // namespace

std::string Device::to_string() const {
  return kind == DeviceKind::host ? "host" : "cuda:" + std::to_string(index);
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = detect();
  return info;
}

Device default_device(int local_rank) {
  const DeviceInfo& info = device_info();
  if (info.gpu_count == 0) return Device::host();
  return Device::cuda(local_rank % info.gpu_count);
}

void* host_alloc(std::size_t bytes, bool pinned) {
  std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (rounded == 0) rounded = kHostAlignment;
#ifdef STAGEHAND_HAVE_CUDA
  if (pinned && !simulated()) {
    void* ptr = nullptr;
    if (cudaHostAlloc(&ptr, rounded, cudaHostAllocDefault) != cudaSuccess) return nullptr;
    return ptr;
  }
#else
  (void)pinned;
#endif
  if (rounded >= 2 * kHugePage) {
    rounded = (rounded + kHugePage - 1) / kHugePage * kHugePage;
    void* ptr = std::aligned_alloc(kHugePage, rounded);
    if (ptr != nullptr) ::madvise(ptr, rounded, MADV_HUGEPAGE);
    return ptr;
  }
  return std::aligned_alloc(kHostAlignment, rounded);
}

void host_free(void* ptr, bool pinned) {
  if (ptr == nullptr) return;
#ifdef STAGEHAND_HAVE_CUDA
  if (pinned && !simulated()) {
    cudaFreeHost(ptr);
    return;
  }
#else
  (void)pinned;
#endif
  std::free(ptr);
}

void* device_alloc(Device device, std::size_t bytes) {
  if (device.is_cuda() && simulated()) return copy_engine().alloc_device(bytes);
#ifdef STAGEHAND_HAVE_CUDA
  if (device.is_cuda()) {
    void* ptr = nullptr;
    if (cudaSetDevice(device.index) != cudaSuccess) return nullptr;
    if (cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) != cudaSuccess) return nullptr;
    return ptr;
  }
#endif
  return host_alloc(bytes, false);
}

void device_free(Device device, void* ptr) {
  if (device.is_cuda() && simulated()) {
    // A free the simulated device refuses (a copy still uses the memory) was logged and
    // counted by it; the memory is kept rather than freed under the copy.
    (void)copy_engine().free_device(ptr);
    return;
  }
#ifdef STAGEHAND_HAVE_CUDA
  if (device.is_cuda()) {
    cudaFree(ptr);
    return;
  }
#endif
  host_free(ptr, false);
}

bool copy_to_host(Device src_device, const void* src, void* dst, std::size_t bytes) {
  if (bytes == 0) return true;
  if (src_device.is_cuda() && simulated()) return copy_engine().copy(CopyKind::device_to_host, dst, src, bytes).is_ok();
#ifdef STAGEHAND_HAVE_CUDA
  if (src_device.is_cuda()) {
    return cudaSetDevice(src_device.index) == cudaSuccess &&
           cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
#else
  (void)src_device;
#endif
  std::memcpy(dst, src, bytes);
  return true;
}

bool copy_from_host(Device dst_device, const void* src, void* dst, std::size_t bytes) {
  if (bytes == 0) return true;
  if (dst_device.is_cuda() && simulated()) return copy_engine().copy(CopyKind::host_to_device, dst, src, bytes).is_ok();
#ifdef STAGEHAND_HAVE_CUDA
  if (dst_device.is_cuda()) {
    return cudaSetDevice(dst_device.index) == cudaSuccess &&
           cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  }
#else
  (void)dst_device;
#endif
  std::memcpy(dst, src, bytes);
  return true;
}

}  // namespace stagehand
