#define BOOST_TEST_MODULE process_collectives
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <caf/all.hpp>

#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <latch>
#include <random>
#include <thread>

#include "stagehand/models/gloo_mesh.hpp"
#include "stagehand/models/gloo_process.hpp"
#include "stagehand/models/process_collectives.hpp"
#include "stagehand/models/rendezvous.hpp"
#include "stagehand/models/weight_store.hpp"

using namespace stagehand;
using Clock = std::chrono::steady_clock;

namespace {

/// Every rank of `layout` with its own ProcessCollectives (its own Gloo device and contexts, as a
/// process of its own would have), meeting at rank 0's rendezvous store; all in one actor system.
struct GlooWorld {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  ParallelLayout layout;
  std::vector<std::unique_ptr<ProcessCollectives>> ranks;
  std::vector<RankGroups> groups;

  /// @param unannounced a rank never told where the rendezvous is (-1: none).
  GlooWorld(ParallelLayout l, std::chrono::milliseconds timeout, int unannounced = -1) : layout(l) {
    std::signal(SIGPIPE, SIG_IGN);
    for (int r = 0; r < layout.world_size(); ++r) {
      ranks.push_back(std::make_unique<ProcessCollectives>(system, "127.0.0.1", timeout));
      groups.push_back(ranks.back()->groups(layout, r));
    }
    auto store = ranks[0]->host_rendezvous();
    for (int r = 0; r < layout.world_size(); ++r) {
      if (r != unannounced) ranks[static_cast<std::size_t>(r)]->set_rendezvous(store);
    }
  }

  /// Runs `body(rank)` on one thread per rank, then requires that no rank's call given to ok()
  /// failed. Boost.Test's macros are not thread-safe: a rank's thread checks through ok(), and
  /// the test's thread reports (concurrent BOOST_REQUIREs on the rank threads corrupted the
  /// framework's state: std::length_error, crashes and hangs, about 1 run in 40).
  void run(const std::function<void(int)>& body) {
    failed.assign(static_cast<std::size_t>(layout.world_size()), Status::ok());
    std::vector<std::thread> threads;
    for (int r = 0; r < layout.world_size(); ++r)
      threads.emplace_back(body, r);
    for (auto& t : threads)
      t.join();
    for (std::size_t r = 0; r < failed.size(); ++r)
      BOOST_REQUIRE_MESSAGE(failed[r].is_ok(), "rank " << r << ": " << failed[r].to_string());
  }

  /// On rank `r`'s thread: whether `st` and every call of this rank checked before succeeded
  /// (the first failure is kept for run() to report).
  bool ok(int r, Status st) {
    Status& first = failed[static_cast<std::size_t>(r)];
    if (!st.is_ok() && first.is_ok()) first = std::move(st);
    return first.is_ok();
  }

  std::vector<Status> failed;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1000.0f);
  std::vector<float> out(n);
  for (auto& x : out)
    x = dist(gen);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gloo_groups_give_the_host_groups_bits_for_every_layout) {
  // Buffers not a multiple of any group size; 40001 floats do not fit a posted receive (their
  // floats follow their head in a second transfer).
  for (auto [layout, n] : {std::pair{ParallelLayout{2, 2}, std::size_t{1001}},
                           std::pair{ParallelLayout{1, 3}, std::size_t{1001}},
                           std::pair{ParallelLayout{4, 1}, std::size_t{1001}},
                           std::pair{ParallelLayout{1, 3}, std::size_t{40001}}}) {
    BOOST_TEST_CONTEXT("tensor " << layout.tensor_parallel << " x data " << layout.data_parallel
                                 << ", " << n << " floats") {
      GlooWorld world(layout, std::chrono::seconds(20));
      auto host = make_host_groups(layout);
      // Per rank: the reduction's input and result, and an all-gather of uneven regions, each
      // through Gloo and through the in-process groups.
      std::vector<std::vector<float>> gloo_sum(static_cast<std::size_t>(layout.world_size()));
      auto host_sum = gloo_sum;
      auto gloo_gathered = gloo_sum;
      auto host_gathered = gloo_sum;
      auto body = [&](std::vector<RankGroups>& groups, std::vector<std::vector<float>>& sum,
                      std::vector<std::vector<float>>& gathered) {
        return [&](int r) {
          const auto i = static_cast<std::size_t>(r);
          const int dp = layout.data_index(r);
          auto ok = [&](Status st) { return world.ok(r, std::move(st)); };
          sum[i] = random_floats(n, static_cast<unsigned>(r));
          for (int repeat = 0; repeat < 3; ++repeat) {
            if (!ok(groups[i].tensor->all_reduce_sum(layout.tensor_index(r), sum[i].data(), n))) return;
            if (!ok(groups[i].data->all_reduce_sum(dp, sum[i].data(), n))) return;
          }
          gathered[i] = random_floats(n, 100u + static_cast<unsigned>(layout.tensor_index(r)));
          const std::size_t lo =
              n * static_cast<std::size_t>(dp) * static_cast<std::size_t>(dp) /
              static_cast<std::size_t>(layout.data_parallel * layout.data_parallel);
          const std::size_t hi =
              n * static_cast<std::size_t>(dp + 1) * static_cast<std::size_t>(dp + 1) /
              static_cast<std::size_t>(layout.data_parallel * layout.data_parallel);
          for (std::size_t k = lo; k < hi; ++k)
            gathered[i][k] += static_cast<float>(dp);
          ok(groups[i].data->all_gather(dp, gathered[i].data(), n, lo, hi - lo));
        };
      };
      world.run(body(world.groups, gloo_sum, gloo_gathered));
      world.run(body(host, host_sum, host_gathered));
      for (std::size_t r = 0; r < gloo_sum.size(); ++r) {
        BOOST_TEST(std::memcmp(gloo_sum[r].data(), host_sum[r].data(), n * sizeof(float)) == 0,
                   "sum of rank " << r);
        BOOST_TEST(
            std::memcmp(gloo_gathered[r].data(), host_gathered[r].data(), n * sizeof(float)) == 0,
            "gather of rank " << r);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_member_that_stops_fails_the_others_naming_its_rank) {
  // Two ways to stop: go away (its connections close, as when its process dies) and fall silent
  // (only the time limit ends the wait).
  for (bool goes_away : {true, false}) {
    BOOST_TEST_CONTEXT((goes_away ? "goes away" : "falls silent")) {
      const auto timeout = std::chrono::seconds(2);
      GlooWorld world({1, 3}, timeout);
      std::vector<Status> second(3);
      std::vector<double> seconds(3);
      // Every member finishes the first collective before rank 2 stops: a member that closes its
      // connections while another is still reading its last message may reset that read (TCP),
      // which is a failure of the first collective, not the one this test is about.
      std::atomic<int> first_done{0};
      world.run([&](int r) {
        const auto i = static_cast<std::size_t>(r);
        float x = 1.0f;
        if (!world.ok(r, world.groups[i].data->all_reduce_sum(r, &x, 1))) return;
        ++first_done;
        while (first_done.load() < 3) std::this_thread::yield();
        if (r == 2) {
          if (goes_away) {
            world.groups[i] = RankGroups{};  // its Gloo context and connections with it
          } else {
            std::this_thread::sleep_for(timeout + std::chrono::seconds(1));
          }
          return;
        }
        auto start = Clock::now();
        second[i] = world.groups[i].data->all_reduce_sum(r, &x, 1);
        seconds[i] = std::chrono::duration<double>(Clock::now() - start).count();
      });
      for (int r : {0, 1}) {
        const auto& st = second[static_cast<std::size_t>(r)];
        BOOST_TEST(!st.is_ok());
        BOOST_TEST(st.message().find("rank 2") != std::string::npos, st.message());
        BOOST_TEST(seconds[static_cast<std::size_t>(r)] < 2.0 * 2 + 1.0,
                   seconds[static_cast<std::size_t>(r)]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_member_gone_right_after_a_collective_fails_the_next_one_not_that_one) {
  // Rank 2 drops its groups as soon as its collective returned, as a process that ends does,
  // while the others may still be posting the receives of the next one; theirs had all its data
  // and succeeds (it failed so in one world in ten or so), the next one fails.
  int worlds = 0;
  const auto until = Clock::now() + std::chrono::seconds(4);
  for (; worlds < 60 && Clock::now() < until; ++worlds) {
    GlooWorld world({1, 3}, std::chrono::seconds(10));
    std::vector<Status> last(3, Status::ok());
    std::vector<Status> next(3, Status::ok());
    world.run([&](int r) {
      const auto i = static_cast<std::size_t>(r);
      std::vector<float> x(1000, float(r));
      last[i] = world.groups[i].data->all_reduce_sum(r, x.data(), x.size());
      if (r == 2) {
        world.groups[i] = RankGroups{};
        return;
      }
      next[i] = world.groups[i].data->all_reduce_sum(r, x.data(), x.size());
    });
    for (std::size_t r : {0u, 1u}) {
      BOOST_TEST_CONTEXT("world " << worlds << ", rank " << r) {
        BOOST_REQUIRE_MESSAGE(last[r].is_ok(), last[r].message());
        BOOST_REQUIRE(!next[r].is_ok());
      }
    }
  }
  BOOST_TEST_MESSAGE(worlds << " worlds");
}

BOOST_AUTO_TEST_CASE(close_and_abort_release_a_waiting_collective_at_once) {
  for (bool closes : {true, false}) {
    BOOST_TEST_CONTEXT((closes ? "close" : "abort")) {
      GlooWorld world({1, 2}, std::chrono::seconds(30));
      Status waited;
      double seconds = 0;
      world.run([&](int r) {
        float x = 1.0f;
        if (!world.ok(r, world.groups[static_cast<std::size_t>(r)].data->all_reduce_sum(r, &x, 1))) return;
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          // Rank 0's group is out of step once its collective is released: nothing to wait for.
          if (closes) {
            world.ok(r, world.ranks[0]->close("rank 0 is done"));
          } else {
            world.ranks[0]->abort("rank 0 is done");
          }
          return;
        }
        auto start = Clock::now();
        waited = world.groups[0].data->all_reduce_sum(0, &x, 1);
        seconds = std::chrono::duration<double>(Clock::now() - start).count();
      });
      BOOST_TEST((waited.code() == ErrorCode::aborted));
      BOOST_TEST(waited.message().find("rank 0 is done") != std::string::npos, waited.message());
      BOOST_TEST(seconds < 5.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(close_lets_every_member_finish_its_last_collective_before_connections_go) {
  // Each rank closes right after its last collective, then drops its groups and their
  // connections, as a process that exits does. close() returns only once the last collective of
  // every member of the rank's groups has: without that, the connections of a member that
  // finished first went while others were still reading (one world in six to ten failed its last
  // collective so, here). Every rank checks it, in worlds repeated for as long as a few seconds
  // allow.
  int worlds = 0;
  const auto until = Clock::now() + std::chrono::seconds(6);
  for (ParallelLayout layout : {ParallelLayout{1, 3}, ParallelLayout{2, 2}}) {
    for (int repeat = 0; repeat < 40 && Clock::now() < until; ++repeat, ++worlds) {
      GlooWorld world(layout, std::chrono::seconds(10));
      const auto n = static_cast<std::size_t>(layout.world_size());
      std::vector<Status> last(n, Status::ok());
      std::vector<Status> closed(n, Status::ok());
      std::vector<std::atomic<bool>> returned(n);
      std::vector<std::string> still_running(n);  // members of its groups when close() returned
      world.run([&](int r) {
        const auto i = static_cast<std::size_t>(r);
        std::vector<float> x(1000, float(r));
        last[i] =
            world.groups[i].tensor->all_reduce_sum(layout.tensor_index(r), x.data(), x.size());
        if (last[i].is_ok())
          last[i] = world.groups[i].data->all_reduce_sum(layout.data_index(r), x.data(), x.size());
        returned[i] = true;
        closed[i] = world.ranks[i]->close("rank " + std::to_string(r) + " is done");
        for (int other = 0; other < layout.world_size(); ++other) {
          const bool shares_a_group = layout.data_index(other) == layout.data_index(r) ||
                                      layout.tensor_index(other) == layout.tensor_index(r);
          if (shares_a_group && !returned[static_cast<std::size_t>(other)])
            still_running[i] += " " + std::to_string(other);
        }
        world.groups[i] = RankGroups{};
      });
      for (std::size_t r = 0; r < n; ++r) {
        BOOST_TEST_CONTEXT("world " << worlds << ", rank " << r) {
          BOOST_REQUIRE_MESSAGE(last[r].is_ok(), last[r].message());
          BOOST_REQUIRE_MESSAGE(closed[r].is_ok(), closed[r].message());
          BOOST_REQUIRE_MESSAGE(
              still_running[r].empty(),
              "close() returned before the last collective of ranks" << still_running[r]);
        }
      }
    }
  }
  BOOST_TEST_MESSAGE(worlds << " worlds closed cleanly");
}

BOOST_AUTO_TEST_CASE(close_names_a_member_that_does_not_say_goodbye_within_the_limit) {
  const auto limit = std::chrono::seconds(1);
  GlooWorld world({1, 3}, limit);
  std::vector<Status> closed(3, Status::ok());
  std::vector<double> seconds(3);
  world.run([&](int r) {
    const auto i = static_cast<std::size_t>(r);
    float x = 1.0f;
    if (!world.ok(r, world.groups[i].data->all_reduce_sum(r, &x, 1))) return;
    if (r == 2) {
      std::this_thread::sleep_for(limit + std::chrono::milliseconds(1500));
      return;
    }
    auto start = Clock::now();
    closed[i] = world.ranks[i]->close("rank " + std::to_string(r) + " is done");
    seconds[i] = std::chrono::duration<double>(Clock::now() - start).count();
  });
  for (std::size_t r : {0u, 1u}) {
    BOOST_TEST((closed[r].code() == ErrorCode::timeout), closed[r].to_string());
    BOOST_TEST(closed[r].message().find("rank 2 did not say goodbye") != std::string::npos,
               closed[r].message());
    BOOST_TEST(closed[r].message().find("the close limit of 1 s") != std::string::npos,
               closed[r].message());
    BOOST_TEST(seconds[r] < 1.0 + 1.0, seconds[r]);
  }
}

BOOST_AUTO_TEST_CASE(connecting_a_group_ends_within_the_limit_naming_the_rank_that_did_not_come) {
  // Rank 3 never takes part, never learns where the rendezvous is, or comes once ranks 0 and 1
  // gave up, with rank 2 coming in between: then each wait alone (rank 2's address, then rank
  // 3's) ends within the limit, the connect as a whole does not.
  const auto limit = std::chrono::seconds(2);
  enum class Late { never, unannounced, one_after_another };
  for (Late late : {Late::never, Late::unannounced, Late::one_after_another}) {
    BOOST_TEST_CONTEXT("case " << static_cast<int>(late)) {
      GlooWorld world({1, 4}, limit, late == Late::unannounced ? 3 : -1);
      std::vector<Status> first(4, Status::ok());
      std::vector<double> seconds(4);
      std::latch started(4);
      std::atomic<int> gave_up{0};
      world.run([&](int r) {
        const auto i = static_cast<std::size_t>(r);
        started.arrive_and_wait();
        const auto start = Clock::now();
        if (late == Late::never && r == 3) return;
        if (late == Late::one_after_another && r == 2)
          std::this_thread::sleep_until(start + limit * 4 / 10);
        if (late == Late::one_after_another && r == 3) {
          while (gave_up.load() < 2 && Clock::now() < start + 3 * limit)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        float x = 1.0f;
        first[i] = world.groups[i].data->all_reduce_sum(r, &x, 1);
        seconds[i] = std::chrono::duration<double>(Clock::now() - start).count();
        if (r < 2) ++gave_up;
      });
      for (std::size_t r : {0u, 1u}) {
        BOOST_TEST((first[r].code() == ErrorCode::timeout), first[r].to_string());
        BOOST_TEST(
            first[r].message().find("rank 3 did not publish its address") != std::string::npos,
            first[r].message());
        BOOST_TEST(first[r].message().find("the connect limit of 2 s") != std::string::npos,
                   first[r].message());
        BOOST_TEST(seconds[r] < 2.0 + 1.0, seconds[r]);
      }
      if (late == Late::unannounced) {
        BOOST_TEST(first[3].message().find("rank 3: rank 0's rendezvous was not announced within "
                                           "the connect limit of 2 s") != std::string::npos,
                   first[3].message());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_member_that_publishes_but_never_connects_is_named_within_the_limit) {
  // Member 3 publishes addresses on 127.0.0.2, where nothing listens, and never connects. Gloo
  // has the lower address listen, so members 0 to 2 wait for member 3 to connect to them: that
  // wait ends within the connect limit (Gloo's own would be five times a pair's timeout).
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  const auto limit = std::chrono::seconds(1);
  const std::vector<int> ranks{10, 11, 12, 13};
  auto store = spawn_rendezvous_store(system);
  // A pair's address as Gloo sends it (gloo/transport/tcp/address.h): a sockaddr_storage and a
  // sequence number. Should it change, the members refuse its size instead of waiting.
  struct GlooAddress {
    sockaddr_storage ss;
    ssize_t seq;
  };
  GlooAddress nowhere{};
  auto* in = reinterpret_cast<sockaddr_in*>(&nowhere.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(9);
  BOOST_REQUIRE(::inet_pton(AF_INET, "127.0.0.2", &in->sin_addr) == 1);
  std::string addresses;
  for (int m = 0; m < 3; ++m)
    addresses.append(reinterpret_cast<const char*>(&nowhere), sizeof(nowhere));
  BOOST_REQUIRE(
      RendezvousClient(system, store).set("mesh/3", addresses, Clock::now() + limit).is_ok());
  std::vector<Status> connected(3, Status::ok());
  std::vector<double> seconds(3);
  std::vector<std::thread> members;
  for (int m = 0; m < 3; ++m) {
    members.emplace_back([&, m] {
      GlooProcess process(system, "127.0.0.1", limit);
      process.set_rendezvous(store);
      const auto start = Clock::now();
      connected[static_cast<std::size_t>(m)] =
          connect_gloo_mesh(process, "mesh", ranks, m, start + limit).status();
      seconds[static_cast<std::size_t>(m)] =
          std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& member : members)
    member.join();
  for (std::size_t m = 0; m < 3; ++m) {
    BOOST_TEST((connected[m].code() == ErrorCode::timeout), connected[m].to_string());
    BOOST_TEST(connected[m].message().find("rank 13 did not connect within the connect limit of "
                                           "1 s") != std::string::npos,
               connected[m].message());
    BOOST_TEST(seconds[m] < 1.0 + 1.0, seconds[m]);
  }
  caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(weights_published_across_a_gloo_group_equal_the_in_process_store) {
  const std::int64_t D = 3, K = 2, H = 4;
  GlooWorld world({2, 1}, std::chrono::seconds(20));
  // Each tensor-parallel member writes its half of the hidden units (and member 0 the bias of fc2).
  auto write_shard = [&](int t, std::int64_t version) {
    return [=](PolicyWeights& w) {
      for (std::int64_t h = t * H / 2; h < (t + 1) * H / 2; ++h) {
        for (std::int64_t d = 0; d < D; ++d)
          w.fc1_weight[static_cast<std::size_t>(h * D + d)] =
              float(version * 100 + h * D + d) / 7.0f;
        w.fc1_bias[static_cast<std::size_t>(h)] = -float(h) / 3.0f;
        for (std::int64_t k = 0; k < K; ++k)
          w.fc2_weight[static_cast<std::size_t>(k * H + h)] = float(k - h) / 9.0f;
      }
      if (t == 0) w.fc2_bias = {0.5f, -0.25f};
    };
  };
  WeightStore local(2, D, K, H);
  std::vector<std::shared_ptr<WeightStore>> stores;
  for (int t = 0; t < 2; ++t)
    stores.push_back(WeightStore::across_group(world.groups[static_cast<std::size_t>(t)].tensor, t,
                                               t == 0, D, K, H));
  for (std::int64_t version : {1, 2}) {
    for (int t = 0; t < 2; ++t)
      BOOST_REQUIRE(local.publish_shard(version, write_shard(t, version)).is_ok());
    world.run([&](int t) {
      world.ok(t, stores[static_cast<std::size_t>(t)]->publish_shard(version, write_shard(t, version)));
    });
    auto expected = local.wait_for(version, std::chrono::seconds(1));
    auto published = stores[0]->wait_for(version, std::chrono::seconds(1));
    BOOST_REQUIRE(expected.is_ok());
    BOOST_REQUIRE(published.is_ok());
    BOOST_TEST((*published)->fc1_weight == (*expected)->fc1_weight);
    BOOST_TEST((*published)->fc1_bias == (*expected)->fc1_bias);
    BOOST_TEST((*published)->fc2_weight == (*expected)->fc2_weight);
    BOOST_TEST((*published)->fc2_bias == (*expected)->fc2_bias);
    // The sending member keeps nothing.
    BOOST_TEST(!stores[1]->wait_for(version, std::chrono::milliseconds(10)).is_ok());
  }
}
