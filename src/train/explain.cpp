// replay_state() and bisect_step(): the trainer's side of `fastudy replay` and `fastudy bisect`
// (see explain.hpp).
#include "src/train/explain.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.hpp"
#include "src/train/engine.hpp"
#include "src/train/libtorch.hpp"

namespace fastudy {
namespace {

// `a` in dtype `to` (f32 or f64), values converted one by one.
void convert(NamedArray& a, DType to) {
  if (a.dtype == to || (a.dtype != DType::f32 && a.dtype != DType::f64)) return;
  const std::int64_t n = a.numel();
  std::vector<std::byte> data(static_cast<std::size_t>(n) * dtype_size(to));
  if (to == DType::f64) {
    const float* x = a.as<float>();
    double* y = reinterpret_cast<double*>(data.data());
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i];
  } else {
    const double* x = a.as<double>();
    float* y = reinterpret_cast<float*>(data.data());
    for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
  }
  a.data = std::move(data);
  a.dtype = to;
}

// A tensor as doubles on the host.
std::vector<double> host_doubles(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

OpComparison compare(const std::string& op, const torch::Tensor& ta, const torch::Tensor& tb, double u, double bound) {
  OpComparison c;
  c.op = op;
  const std::vector<double> a = host_doubles(ta), b = host_doubles(tb);
  if (a.size() != b.size()) throw Error("bisect: op " + op + " has " + std::to_string(a.size()) + " values in one run and " +
                                        std::to_string(b.size()) + " in the other");
  c.numel = static_cast<std::int64_t>(a.size());
  c.identical = ta.scalar_type() == tb.scalar_type() && ta.sizes() == tb.sizes() &&
                std::memcmp(ta.detach().to(torch::kCPU).contiguous().data_ptr(), tb.detach().to(torch::kCPU).contiguous().data_ptr(),
                            static_cast<std::size_t>(ta.numel()) * ta.element_size()) == 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i])) c.ref_max = std::max(c.ref_max, std::fabs(a[i]));
    const bool same_class = std::isfinite(a[i]) == std::isfinite(b[i]);
    const double d = !same_class ? INFINITY : std::isfinite(a[i]) ? std::fabs(a[i] - b[i]) : 0.0;
    c.max_abs = std::max(c.max_abs, d);
  }
  c.ulps = c.max_abs == 0 ? 0.0 : c.ref_max > 0 ? c.max_abs / (u * c.ref_max) : INFINITY;
  c.beyond = !c.identical && c.ulps > bound;
  return c;
}

}  // namespace

TrainState replay_state(const Variant& v, TrainState s) {
  const DType container = v.precision == Format::fp64 ? DType::f64 : DType::f32;
  for (NamedArray& a : s.params) convert(a, container);
  for (NamedArray& a : s.optimizer) convert(a, container);
  auto it = s.attrs.find("precision");
  const bool was_fp16 = it != s.attrs.end() && it->second == "fp16";
  if (was_fp16 != (v.precision == Format::fp16)) {
    s.loss_scale = v.precision == Format::fp16 ? v.train.loss_scale : 1.0;
    s.good_steps = 0;
  }
  return s;
}

TrainState advance_state(const Variant& v, const TrainState& s, std::int64_t to_step) {
  train::Engine engine(v, TrainHooks{}, &s);
  while (engine.steps_done() < to_step) {
    const train::Engine::Step step = engine.step();
    if (step.diverged)
      throw UsageError("variant " + v.id + " diverges at step " + std::to_string(step.log.step) + ", before step " +
                           std::to_string(to_step) + " (" + step.event + ")",
                       "pass a step before it: the last step whose weights exist is " + std::to_string(step.log.step - 1));
  }
  return engine.state();
}

BisectResult bisect_step(const Variant& a, const Variant& b, const TrainState& state,
                         const std::function<double(const std::string&)>& plant_b) {
  BisectResult r;
  r.format = unit_roundoff(a.precision) >= unit_roundoff(b.precision) ? a.precision : b.precision;
  r.bound_ulps = kBisectBoundUlps;
  const double u = unit_roundoff(r.format);
  const TrainState sa = replay_state(a, state), sb = replay_state(b, state);
  train::Engine ea(a, TrainHooks{}, &sa);
  train::Engine eb(b, TrainHooks{}, &sb);
  const auto ta = ea.trace_step({});
  const auto tb = eb.trace_step(plant_b);
  if (ta.size() != tb.size()) {
    throw Error("bisect: the two variants ran " + std::to_string(ta.size()) + " and " + std::to_string(tb.size()) + " ops",
                "bisect compares variants of one model");
  }
  for (std::size_t i = 0; i < ta.size(); ++i) {
    if (ta[i].first != tb[i].first) throw Error("bisect: op " + ta[i].first + " of one run is " + tb[i].first + " in the other");
    r.ops.push_back(compare(ta[i].first, ta[i].second, tb[i].second, u, r.bound_ulps));
    const int idx = static_cast<int>(i);
    if (r.first_differs < 0 && !r.ops.back().identical) r.first_differs = idx;
    if (r.first_beyond < 0 && r.ops.back().beyond) r.first_beyond = idx;
  }
  return r;
}

}  // namespace fastudy
