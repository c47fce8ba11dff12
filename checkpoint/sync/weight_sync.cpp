#include "stagehand/checkpoint/sync/weight_sync.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>

#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/planner.hpp"

namespace stagehand {

namespace {

Status invalid(const std::string& why) { return {ErrorCode::invalid_argument, "weight sync: " + why}; }

}  // namespace

Result<WeightSyncPlan> plan_weight_sync(const std::vector<std::vector<ShardedTensorDesc>>& senders,
                                        const std::vector<std::vector<ShardedTensorDesc>>& receivers) {
  if (senders.empty()) return invalid("no sender (trainer rank)");
  if (receivers.empty()) return invalid("no receiver (inference rank)");
  // Which sender sends each distinct block: the save's global plan, as if the senders saved.
  std::vector<LocalPlan> locals(senders.size());
  std::vector<const LocalPlan*> plans;
  for (std::size_t r = 0; r < senders.size(); ++r) {
    locals[r].rank = static_cast<int>(r);
    locals[r].tensors = senders[r];
    plans.push_back(&locals[r]);
  }
  auto global = make_global_plan(plans);
  if (!global.is_ok()) return global.status().with_context("weight sync: the trainer ranks' blocks");

  struct Sent {
    int sender;
    std::uint32_t index;
  };
  std::map<std::string, std::vector<Sent>> by_name;
  for (std::size_t r = 0; r < senders.size(); ++r) {
    for (std::uint32_t i : global->writes[r]) by_name[senders[r][i].name].push_back({static_cast<int>(r), i});
  }

  WeightSyncPlan plan;
  plan.sent_bytes.assign(senders.size(), 0);
  plan.received_bytes.assign(receivers.size(), 0);
  for (const auto& s : senders) plan.sender_signatures.push_back(structure_signature(s));
  for (const auto& q : receivers) plan.receiver_signatures.push_back(structure_signature(q));
  for (std::size_t q = 0; q < receivers.size(); ++q) {
    const std::string who = "receiver " + std::to_string(q);
    for (std::uint32_t j = 0; j < receivers[q].size(); ++j) {
      const ShardedTensorDesc& block = receivers[q][j];
      SH_RETURN_IF_ERROR(block.validate().with_context("weight sync: " + who));
      auto found = by_name.find(block.name);
      if (found == by_name.end()) {
        return invalid(who + "'s tensor '" + block.name + "' is held by no trainer rank");
      }
      const ShardedTensorDesc& any = senders[found->second.front().sender][found->second.front().index];
      if (any.dtype != block.dtype || any.global_shape != block.global_shape) {
        return invalid(who + "'s tensor '" + block.name + "' is " + std::string(dtype_name(block.dtype)) + " " +
                       block.global_shape.to_string() + ", the trainer ranks' " + std::string(dtype_name(any.dtype)) +
                       " " + any.global_shape.to_string());
      }
      std::int64_t covered = 0;
      for (const Sent& s : found->second) {
        const std::int64_t n = overlap_numel(chunk_of(senders[s.sender][s.index]), block);
        if (n == 0) continue;
        covered += n;
        plan.transfers.push_back({s.sender, s.index, static_cast<int>(q), j,
                                  static_cast<std::uint64_t>(n) * dtype_size(block.dtype)});
      }
      // The sent blocks tile the tensor (the global plan checked): every element is covered once.
      if (covered != block.local_shape.numel()) {
        return Status{ErrorCode::internal, "weight sync: " + who + "'s block of '" + block.name + "' at " +
                                         block.global_offset.to_string() + " is covered by " +
                                         std::to_string(covered) + " of its " +
                                         std::to_string(block.local_shape.numel()) + " elements"};
      }
    }
  }
  std::stable_sort(plan.transfers.begin(), plan.transfers.end(), [](const SyncTransfer& a, const SyncTransfer& b) {
    return a.sender != b.sender ? a.sender < b.sender : a.receiver < b.receiver;
  });
  for (const SyncTransfer& t : plan.transfers) {
    plan.sent_bytes[static_cast<std::size_t>(t.sender)] += t.bytes;
    plan.received_bytes[static_cast<std::size_t>(t.receiver)] += t.bytes;
  }
  return plan;
}

Status sync_in_process(const WeightSyncPlan& plan, const std::vector<const StateDict*>& senders,
                       const std::vector<StateDict*>& receivers, int threads) {
  if (senders.size() != plan.sender_signatures.size() || receivers.size() != plan.receiver_signatures.size()) {
    return invalid("the plan is for " + std::to_string(plan.sender_signatures.size()) + " sender(s) and " +
                   std::to_string(plan.receiver_signatures.size()) + " receiver(s), got " +
                   std::to_string(senders.size()) + " and " + std::to_string(receivers.size()));
  }
  auto check = [](const StateDict& state, std::uint64_t planned, const std::string& who) -> Status {
    if (structure_signature(state) != planned) {
      return invalid(who + "'s state has other tensors or shapes than the plan was made for");
    }
    for (const auto& t : state.tensors) {
      if (t.tensor.device().is_cuda()) {
        return invalid(who + "'s tensor '" + t.desc.name + "' is in device memory: the device path of weight sync "
                             "is not built yet");
      }
    }
    return state.validate().with_context("weight sync: " + who);
  };
  for (std::size_t r = 0; r < senders.size(); ++r) {
    SH_RETURN_IF_ERROR(check(*senders[r], plan.sender_signatures[r], "sender " + std::to_string(r)));
  }
  for (std::size_t q = 0; q < receivers.size(); ++q) {
    SH_RETURN_IF_ERROR(check(*receivers[q], plan.receiver_signatures[q], "receiver " + std::to_string(q)));
  }
  // Each receiver's transfers on one thread: no two threads write the same block.
  std::vector<std::vector<const SyncTransfer*>> by_receiver(receivers.size());
  for (const SyncTransfer& t : plan.transfers) by_receiver[static_cast<std::size_t>(t.receiver)].push_back(&t);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (std::size_t q = next.fetch_add(1); q < receivers.size(); q = next.fetch_add(1)) {
      for (const SyncTransfer* t : by_receiver[q]) {
        const ShardedTensor& from = senders[static_cast<std::size_t>(t->sender)]->tensors[t->sender_tensor];
        ShardedTensor& to = receivers[q]->tensors[t->receiver_tensor];
        const ChunkMeta chunk = chunk_of(from.desc);
        if (!copy_overlap_part(chunk, to.desc, dtype_size(to.desc.dtype), 0, chunk.shape.numel(),
                               static_cast<const std::uint8_t*>(from.tensor.data()),
                               static_cast<std::uint8_t*>(to.tensor.data()), to.tensor.device())) {
          failed = true;
        }
      }
    }
  };
  const std::size_t n = std::clamp<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), 1, receivers.size());
  std::vector<std::thread> pool;
  for (std::size_t i = 1; i < n; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failed) return {ErrorCode::internal, "weight sync: a copy into a receiver's tensor failed"};
  return Status::ok();
}

}  // namespace stagehand
