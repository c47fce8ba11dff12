#include "stagehand/models/rendezvous.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "stagehand/actors/messages.hpp"

namespace stagehand {

namespace {

class RendezvousStore : public caf::event_based_actor {
 public:
  using caf::event_based_actor::event_based_actor;

  caf::behavior make_behavior() override {
    return {
        [this](rdv_set_atom, const std::string& key, std::string& value) {
          auto waiting = waiting_.find(key);
          if (waiting != waiting_.end()) {
            for (auto& promise : waiting->second)
              promise.deliver(value);
            waiting_.erase(waiting);
          }
          values_[key] = std::move(value);
        },
        [this](rdv_get_atom, const std::string& key) -> caf::result<std::string> {
          if (auto it = values_.find(key); it != values_.end()) return it->second;
          auto promise = make_response_promise<std::string>();
          waiting_[key].push_back(promise);
          return promise;
        },
    };
  }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<caf::typed_response_promise<std::string>>> waiting_;
};

Status failed_request(caf::actor_system& system, const caf::error& err) {
  if (err == caf::sec::request_timeout) return {ErrorCode::timeout, system.render(err)};
  return {ErrorCode::aborted,
          "rank 0's rendezvous store cannot be reached (" + system.render(err) + ")"};
}

// CAF's request timeout is a message from its clock, which a loaded machine can deliver after the
// answer it should have cut off.
Status late() {
  return {ErrorCode::timeout, "answered after the deadline"};
}

}  // namespace

std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    deadline - std::chrono::steady_clock::now()));
}

caf::actor spawn_rendezvous_store(caf::actor_system& system) {
  return system.spawn<RendezvousStore>();
}

RendezvousClient::RendezvousClient(caf::actor_system& system, caf::actor store)
    : system_(system), store_(std::move(store)) {}

Status RendezvousClient::set(const std::string& key, std::string value,
                             Clock::time_point deadline) {
  caf::scoped_actor self{system_};
  std::optional<caf::error> failed;
  self->request(store_, left_until(deadline), rdv_set_atom::value, key, std::move(value))
      .receive([] {}, [&](caf::error& err) { failed = std::move(err); });
  if (failed) return failed_request(system_, *failed);
  if (Clock::now() > deadline) return late();
  return Status::ok();
}

Result<std::string> RendezvousClient::get(const std::string& key, Clock::time_point deadline) {
  caf::scoped_actor self{system_};
  std::optional<caf::error> failed;
  std::string out;
  self->request(store_, left_until(deadline), rdv_get_atom::value, key)
      .receive([&](std::string& value) { out = std::move(value); },
               [&](caf::error& err) { failed = std::move(err); });
  if (failed) return failed_request(system_, *failed);
  if (Clock::now() > deadline) return late();
  return out;
}

}  // namespace stagehand
