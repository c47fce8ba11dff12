#include "stagehand/core/foreground_gate.hpp"

#include <utility>

namespace stagehand {

ForegroundGate::Hold::Hold(ForegroundGate& gate) : gate_(&gate) {
  gate.acquire();
}

ForegroundGate::Hold::Hold(Hold&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}

ForegroundGate::Hold& ForegroundGate::Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    release();
    gate_ = std::exchange(other.gate_, nullptr);
  }
  return *this;
}

void ForegroundGate::Hold::release() {
  if (ForegroundGate* gate = std::exchange(gate_, nullptr)) gate->release_one();
}

void ForegroundGate::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++holds_;
}

void ForegroundGate::release_one() {
  bool free = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free = --holds_ == 0;
  }
  if (free) cv_.notify_all();
}

double ForegroundGate::wait(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (holds_ == 0) return 0;
  const auto start = std::chrono::steady_clock::now();
  cv_.wait_for(lock, limit, [this] { return holds_ == 0; });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int ForegroundGate::holds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return holds_;
}

ForegroundGate& foreground_gate() {
  static ForegroundGate gate;
  return gate;
}

}  // namespace stagehand
