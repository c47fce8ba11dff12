// The weight-sync channel's classes (shared memory or TCP, by the channel's name):
// stagehand.WeightPublisher / WeightReceiver wrap these.

#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>

#include "binding_common.hpp"
#include "stagehand/checkpoint/sync/weight_channel.hpp"

namespace stagehand_python {

void bind_weight_sync(nb::module_& m) {
  auto channel_options = [](std::uint64_t bucket_bytes, int buckets, double receiver_timeout_s,
                            double connect_timeout_s) {
    WeightChannelOptions o;
    o.bucket_bytes = bucket_bytes;
    o.buckets = buckets;
    o.receiver_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(receiver_timeout_s * 1000));
    o.connect_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(connect_timeout_s * 1000));
    return o;
  };
  auto descs_of = [](const BoundTensors& entries) {
    check_untaken(entries);
    return entries.state.descriptors();
  };
  nb::class_<WeightPublisher>(m, "_WeightPublisher")
      .def_static(
          "create",
          [=](const std::string& channel, int rank, int world, const BoundTensors& entries,
              std::uint64_t bucket_bytes, int buckets, double receiver_timeout_s, double connect_timeout_s) {
            std::vector<ShardedTensorDesc> descs = descs_of(entries);
            Result<std::unique_ptr<WeightPublisher>> made = Status{ErrorCode::internal, "not run"};
            {
              nb::gil_scoped_release release;
              made = open_weight_publisher(channel, rank, world, std::move(descs),
                                            channel_options(bucket_bytes, buckets, receiver_timeout_s,
                                                            connect_timeout_s));
            }
            check(made.status());
            return std::move(*made);
          })
      .def(
          "push",
          [](WeightPublisher& self, std::int64_t step, const BoundTensors& entries, int wait_for,
             bool late_only) {
            Result<PushReport> report = Status{ErrorCode::internal, "not run"};
            {
              nb::gil_scoped_release release;
              report = late_only ? self.push_late(step, state_of(entries, {}))
                                 : self.push(step, state_of(entries, {}), wait_for);
            }
            check(report.status());
            nb::dict out;
            out["version"] = report->version;
            out["step"] = report->step;
            out["bytes"] = report->bytes;
            out["delivered"] = report->delivered;
            out["dropped"] = report->dropped;
            return out;
          })
      .def_prop_ro("waiting_receivers", &WeightPublisher::waiting_receivers)
      .def("late_receivers", &WeightPublisher::late_receivers, nb::arg("step"))
      .def_prop_ro("sent_bytes", &WeightPublisher::sent_bytes);
  nb::class_<WeightReceiver>(m, "_WeightReceiver")
      .def_static("connect",
                  [descs_of](const std::string& channel, const std::string& name, const BoundTensors& entries,
                      double connect_timeout_s) {
                    std::vector<ShardedTensorDesc> descs = descs_of(entries);
                    Result<std::unique_ptr<WeightReceiver>> made = Status{ErrorCode::internal, "not run"};
                    {
                      nb::gil_scoped_release release;
                      WeightChannelOptions options;  // a receiver uses only the connect timeout
                      options.connect_timeout =
                          std::chrono::milliseconds(static_cast<std::int64_t>(connect_timeout_s * 1000));
                      made = connect_weight_receiver(channel, name, std::move(descs), options);
                    }
                    check(made.status());
                    return std::move(*made);
                  })
      .def(
          "receive",
          [](WeightReceiver& self, const BoundTensors& entries, std::int64_t min_step,
             double timeout_s) {
            StateDict state = state_of(entries, {});
            Result<std::int64_t> got = Status{ErrorCode::internal, "not run"};
            {
              nb::gil_scoped_release release;
              got = self.receive(state, min_step, std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
            }
            check(got.status());
            return *got;
          })
      .def_prop_ro("newest_pushed_step",
                   [](const WeightReceiver& self) {
                     nb::gil_scoped_release release;  // a TCP receiver asks the trainer ranks
                     return self.newest_pushed_step();
                   })
      .def("stop", &WeightReceiver::stop);
}

}  // namespace stagehand_python
