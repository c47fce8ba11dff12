#include "stagehand/trainers/generator.hpp"

#include <caf/all.hpp>

#include "stagehand/actors/messages.hpp"
#include "stagehand/models/bandit_task.hpp"

namespace stagehand {

namespace {

class Generator : public caf::event_based_actor {
 public:
  Generator(caf::actor_config& cfg, ModelConfig model, std::uint64_t seed, std::shared_ptr<WeightStore> weights,
            std::chrono::milliseconds timeout)
      : caf::event_based_actor(cfg),
        model_(model),
        task_(seed, model.context_dim, model.num_arms),
        weights_(std::move(weights)),
        timeout_(timeout) {}

  caf::behavior make_behavior() override {
    return {
        [this](generate_atom, std::int64_t, std::int64_t version, std::int64_t first,
               std::int64_t count) -> caf::result<std::vector<std::int32_t>> {
          auto weights = weights_->wait_for(version, timeout_);
          if (!weights.is_ok()) return to_caf_error(weights.status());
          return generate_actions(task_, **weights, model_.group_size, static_cast<std::uint64_t>(first),
                                  static_cast<std::size_t>(count));
        },
    };
  }

 private:
  ModelConfig model_;
  BanditTask task_;
  std::shared_ptr<WeightStore> weights_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

caf::actor spawn_generator(caf::actor_system& system, const ModelConfig& model, std::uint64_t seed,
                           std::shared_ptr<WeightStore> weights, std::chrono::milliseconds timeout) {
  return system.spawn<Generator, caf::detached>(model, seed, std::move(weights), timeout);
}

}  // namespace stagehand
