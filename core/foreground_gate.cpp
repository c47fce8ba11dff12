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
  if (holds_++ == 0) taken_ = Clock::now();
}

void ForegroundGate::release_one() {
  bool free = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free = --holds_ == 0;
  }
  if (free) cv_.notify_all();
}

double ForegroundGate::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (holds_ == 0) return 0;
  const auto start = Clock::now();
  cv_.wait_until(lock, taken_ + limit_, [this] { return holds_ == 0; });
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int ForegroundGate::holds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return holds_;
}

void ForegroundGate::set_limit(std::chrono::milliseconds limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = limit;
}

std::chrono::milliseconds ForegroundGate::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

ForegroundGate& foreground_gate() {
  static ForegroundGate gate;
  return gate;
}

}  // namespace stagehand
