#include "stagehand/models/gloo_group.hpp"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "stagehand/models/gloo_mesh.hpp"
#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/rendezvous.hpp"

namespace stagehand {

namespace {

using gloo::transport::UnboundBuffer;

}  // namespace

GlooGroup::GlooGroup(std::shared_ptr<GlooProcess> process, std::string name, std::vector<int> ranks,
                     int member)
    : process_(std::move(process)),
      name_(std::move(name)),
      ranks_(std::move(ranks)),
      member_(member),
      heads_(ranks_.size()),
      parts_(ranks_.size()),
      large_(ranks_.size()) {}

GlooGroup::~GlooGroup() {
  disconnect(false);
}

// -- Collective --

Status GlooGroup::all_reduce_sum(int, float* data, std::size_t count) {
  if (ranks_.size() == 1) return Status::ok();
  std::lock_guard<std::mutex> use(use_);
  SH_RETURN_IF_ERROR(exchange({0, count}, data));
  for (std::size_t m = 0; m < ranks_.size(); ++m) {
    if (static_cast<int>(m) != member_ && heads_[m].count != count) {
      return Status{ErrorCode::internal, "all-reduce of the " + describe() + ": rank " +
                                             std::to_string(ranks_[m]) + " sent " +
                                             std::to_string(heads_[m].count) + " floats, not " +
                                             std::to_string(count)};
    }
  }
  // Member order from 0.0f, as HostGroup adds: the same bits whichever group carries the sum.
  sum_.assign(count, 0.0f);
  for (std::size_t m = 0; m < ranks_.size(); ++m) {
    const float* part = static_cast<int>(m) == member_ ? data : parts_[m];
    for (std::size_t i = 0; i < count; ++i)
      sum_[i] += part[i];
  }
  std::copy(sum_.begin(), sum_.end(), data);
  return Status::ok();
}

Status GlooGroup::all_gather(int, float* full, std::size_t full_count, std::size_t offset,
                             std::size_t count) {
  if (ranks_.size() == 1) return Status::ok();
  std::lock_guard<std::mutex> use(use_);
  // Each member's region is its own to choose: it travels in front of its floats.
  SH_RETURN_IF_ERROR(exchange({offset, count}, full + offset));
  for (std::size_t m = 0; m < ranks_.size(); ++m) {
    if (static_cast<int>(m) == member_) continue;
    const Head& head = heads_[m];
    if (head.offset > full_count || head.count > full_count - head.offset) {
      return Status{ErrorCode::internal,
                    "all-gather of the " + describe() + ": rank " + std::to_string(ranks_[m]) +
                        " sent a region outside the " + std::to_string(full_count) + " floats"};
    }
    std::copy_n(parts_[m], head.count, full + head.offset);
  }
  return Status::ok();
}

// -- the wire protocol --

Status GlooGroup::exchange(Head mine, const float* payload) {
  SH_RETURN_IF_ERROR(connect());
  if (lost_member_ >= 0) {
    Status st = failure_with(lost_member_, lost_what_, Phase::collective);
    give_up(st);
    return st;
  }
  const auto deadline = Clock::now() + process_->limit();
  const std::uint64_t seq = seq_++;
  const std::size_t parity = seq % 2;
  const bool inline_floats = fits(mine.count);
  outbox_.resize(kHeadFloats + (inline_floats ? mine.count : 0));
  std::memcpy(outbox_.data(), &mine, sizeof(Head));
  if (inline_floats) std::copy_n(payload, mine.count, outbox_.data() + kHeadFloats);
  std::vector<std::unique_ptr<UnboundBuffer>> transfers;  // sends, then receives of large floats
  // A transfer the stop can abort; none (the collective fails) once the process is stopped.
  auto tracked = [&](std::unique_ptr<UnboundBuffer> buffer) -> UnboundBuffer* {
    transfers.push_back(std::move(buffer));
    return process_->track(transfers.back().get()) ? transfers.back().get() : nullptr;
  };
  Status st = Status::ok();
  int current = -1;  // the member whose transfer is being posted or waited for
  try {
    std::vector<std::pair<int, UnboundBuffer*>> sends;
    for (current = 0; current < size() && st.is_ok(); ++current) {
      if (current == member_) continue;
      auto* head =
          tracked(context_->createUnboundBuffer(outbox_.data(), outbox_.size() * sizeof(float)));
      auto* floats = head == nullptr || inline_floats
                         ? nullptr
                         : tracked(context_->createUnboundBuffer(const_cast<float*>(payload),
                                                                 mine.count * sizeof(float)));
      if (head == nullptr || (!inline_floats && floats == nullptr)) {
        st = process_->stopped_status();
        break;
      }
      head->send(current, slot_of(seq));
      sends.emplace_back(current, head);
      if (floats != nullptr) {
        floats->send(current, slot_of(seq) + 1);
        sends.emplace_back(current, floats);
      }
    }
    std::vector<std::pair<int, UnboundBuffer*>> large;
    for (current = 0; current < size() && st.is_ok(); ++current) {
      if (current == member_) continue;
      const auto m = static_cast<std::size_t>(current);
      if (!inbox_[m][parity]->waitRecv(nullptr, left_until(deadline))) {
        st = process_->stopped_status();
        break;
      }
      const float* message = inbox_memory(m, parity);
      std::memcpy(&heads_[m], message, sizeof(Head));
      if (fits(heads_[m].count)) {
        parts_[m] = message + kHeadFloats;
        continue;
      }
      large_[m].resize(heads_[m].count);
      auto* floats = tracked(
          context_->createUnboundBuffer(large_[m].data(), large_[m].size() * sizeof(float)));
      if (floats == nullptr) {
        st = process_->stopped_status();
        break;
      }
      floats->recv(current, slot_of(seq) + 1);
      large.emplace_back(current, floats);
      parts_[m] = large_[m].data();
    }
    for (auto& [m, buffer] : large) {
      current = m;
      if (st.is_ok() && !buffer->waitRecv(nullptr, left_until(deadline)))
        st = process_->stopped_status();
    }
    for (auto& [m, buffer] : sends) {
      current = m;
      if (st.is_ok() && !buffer->waitSend(nullptr, left_until(deadline)))
        st = process_->stopped_status();
    }
  } catch (const std::exception& e) {
    st = failure_with(current, e.what(), Phase::collective);
  }
  for (auto& transfer : transfers)
    process_->untrack(transfer.get());
  if (!st.is_ok()) {
    give_up(st);
    return st;
  }
  // Every member's data is here: a member whose connection closed since fails the next
  // collective, not this one.
  try {
    post_inbox(seq + 1, current);
  } catch (const std::exception& e) {
    lost_member_ = current;
    lost_what_ = e.what();
  }
  return Status::ok();
}

Status GlooGroup::connect() {
  if (link_ == Link::connected) return Status::ok();
  if (link_ == Link::closed) return process_->stopped_status();
  auto connected =
      connect_gloo_mesh(*process_, name_, ranks_, member_, Clock::now() + process_->limit());
  if (!connected.is_ok()) {
    Status st = connected.status().with_context("connecting the " + describe() + " over Gloo");
    give_up(st);
    return st;
  }
  context_ = std::move(*connected);
  link_ = Link::connected;
  inbox_memory_.assign(ranks_.size() * 2 * kRoomFloats, 0.0f);
  inbox_.resize(ranks_.size());
  int current = -1;
  try {
    for (int m = 0; m < size(); ++m) {
      if (m == member_) continue;
      for (std::size_t parity = 0; parity < 2; ++parity) {
        auto& inbox = inbox_[static_cast<std::size_t>(m)][parity];
        inbox = context_->createUnboundBuffer(inbox_memory(static_cast<std::size_t>(m), parity),
                                              kRoomFloats * sizeof(float));
        if (!process_->track(inbox.get())) {
          Status st = process_->stopped_status();
          give_up(st);
          return st;
        }
      }
    }
    post_inbox(0, current);
  } catch (const std::exception& e) {
    Status st = failure_with(current, e.what(), Phase::collective);
    give_up(st);
    return st;
  }
  return Status::ok();
}

void GlooGroup::post_inbox(std::uint64_t seq, int& current) {
  for (current = 0; current < size(); ++current) {
    if (current == member_) continue;
    inbox_[static_cast<std::size_t>(current)][seq % 2]->recv(current, slot_of(seq), 0,
                                                             kRoomFloats * sizeof(float));
  }
}

float* GlooGroup::inbox_memory(std::size_t member, std::size_t parity) {
  return inbox_memory_.data() + (member * 2 + parity) * kRoomFloats;
}

// -- goodbye --

Result<bool> GlooGroup::start_farewell() {
  std::unique_lock<std::mutex> use(use_);
  if (link_ != Link::connected) return false;
  if (lost_member_ >= 0) {
    Status st = failure_with(lost_member_, lost_what_, Phase::goodbye);
    disconnect(true);
    return st;
  }
  farewell_out_ = seq_;
  farewell_in_.assign(ranks_.size(), 0);
  farewell_sends_.resize(ranks_.size());
  farewell_receives_.resize(ranks_.size());
  int current = -1;
  try {
    for (current = 0; current < size(); ++current) {
      if (current == member_) continue;
      auto& receive = farewell_receives_[static_cast<std::size_t>(current)];
      receive = context_->createUnboundBuffer(&farewell_in_[static_cast<std::size_t>(current)],
                                              sizeof(std::uint64_t));
      receive->recv(current, kFarewellSlot);
    }
    for (current = 0; current < size(); ++current) {
      if (current == member_) continue;
      auto& send = farewell_sends_[static_cast<std::size_t>(current)];
      send = context_->createUnboundBuffer(&farewell_out_, sizeof(std::uint64_t));
      send->send(current, kFarewellSlot);
    }
  } catch (const std::exception& e) {
    Status st = failure_with(current, e.what(), Phase::goodbye);
    disconnect(true);
    return st;
  }
  farewell_lock_ = std::move(use);
  return true;
}

Status GlooGroup::finish_farewell(Clock::time_point deadline) {
  std::unique_lock<std::mutex> use = std::move(farewell_lock_);
  Status st = Status::ok();
  int current = -1;
  try {
    for (current = 0; current < size() && st.is_ok(); ++current) {
      if (current == member_) continue;
      const auto m = static_cast<std::size_t>(current);
      if (!farewell_receives_[m]->waitRecv(nullptr, left_until(deadline))) {
        st = Status{ErrorCode::aborted, "closing the " + describe() + ": the goodbye of rank " +
                                            std::to_string(ranks_[m]) + " was aborted"};
      } else if (farewell_in_[m] != farewell_out_) {
        st = Status{ErrorCode::internal,
                    "closing the " + describe() + ": rank " + std::to_string(ranks_[m]) +
                        " completed " + std::to_string(farewell_in_[m]) +
                        " collectives of it, rank " +
                        std::to_string(ranks_[static_cast<std::size_t>(member_)]) + " " +
                        std::to_string(farewell_out_)};
      }
    }
    for (current = 0; current < size() && st.is_ok(); ++current) {
      if (current == member_) continue;
      const auto m = static_cast<std::size_t>(current);
      if (!farewell_sends_[m]->waitSend(nullptr, left_until(deadline))) {
        st = Status{ErrorCode::aborted, "closing the " + describe() + ": the goodbye to rank " +
                                            std::to_string(ranks_[m]) + " was aborted"};
      }
    }
  } catch (const std::exception& e) {
    st = failure_with(current, e.what(), Phase::goodbye);
  }
  disconnect(!st.is_ok());
  return st;
}

// -- failures --

Status GlooGroup::failure_with(int member, const std::string& what, Phase phase) const {
  const std::string who = member >= 0 && member < size()
                              ? "rank " + std::to_string(ranks_[static_cast<std::size_t>(member)])
                              : "a member";
  const std::string doing =
      (phase == Phase::collective ? "collective of the " : "closing the ") + describe();
  if (what.find("Timed out") != std::string::npos) {
    const std::string late = phase == Phase::collective
                                 ? " did not take part within " + process_->limit_text("call")
                                 : " did not say goodbye within " + process_->limit_text("close") +
                                       " (its last collective may still be running)";
    return {ErrorCode::timeout, doing + ": " + who + late + " (gloo: " + what + ")"};
  }
  return {ErrorCode::aborted,
          doing + ": " + who + " died or dropped out (its connection closed; gloo: " + what + ")"};
}

void GlooGroup::give_up(const Status& why) {
  process_->stop(why.message());
  disconnect(true);
}

void GlooGroup::disconnect(bool reset) {
  for (auto& buffers : inbox_) {
    for (auto& buffer : buffers) {
      if (buffer) process_->untrack(buffer.get());
    }
  }
  if (reset && context_) context_->closeConnections();
  farewell_sends_.clear();
  farewell_receives_.clear();
  inbox_.clear();
  context_.reset();
  link_ = Link::closed;
}

std::string GlooGroup::describe() const {
  std::string out = name_ + " group (ranks";
  for (int r : ranks_)
    out += " " + std::to_string(r);
  return out + ")";
}

}  // namespace stagehand
