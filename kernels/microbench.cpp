// The microbenchmark point library (see kernels/microbench.hpp): deterministic inputs and the three
// comparisons of one point; its error metrics are the check harness's (kernels/check.hpp).
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d].
#include "kernels/microbench.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "kernels/check.hpp"

namespace fastudy {
namespace {

// A uniform double in [0, 1) from the top 53 bits.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

bool needs_double(const PrecisionPolicy& p) {
  for (Format f : {p.q, p.k, p.v, p.s, p.p, p.o, p.accum, p.stats, p.rescale, p.division, p.grad})
    if (f == Format::fp64) return true;
  return false;
}

std::vector<double> rounded(std::vector<double> x, Format f) {
  round_inplace(f, x.data(), x.size());
  return x;
}

template <class T>
MicrobenchKernelOutput run_kernel(const MicrobenchPoint& pt, const AttentionShape& shape, const AttentionParams& params,
                                  const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dout) {
  std::vector<T> qt(q.begin(), q.end()), kt(k.begin(), k.end()), vt(v.begin(), v.end()), o(q.size());
  std::vector<T> lse(static_cast<std::size_t>(shape.batch * shape.heads * shape.seq_len));
  MicrobenchKernelOutput r;
  r.stats = attention_forward<T>(shape, params, qt.data(), kt.data(), vt.data(), o.data(), lse.data());
  r.o.assign(o.begin(), o.end());
  r.lse.assign(lse.begin(), lse.end());
  if (pt.pass == Pass::forward) {
    r.values = r.o;
    return r;
  }
  std::vector<T> dt(dout.begin(), dout.end()), dq(q.size()), dk(q.size()), dv(q.size());
  attention_backward<T>(shape, params, qt.data(), kt.data(), vt.data(), o.data(), lse.data(), dt.data(), dq.data(),
                        dk.data(), dv.data());
  r.values.reserve(3 * q.size());
  r.values.insert(r.values.end(), dq.begin(), dq.end());
  r.values.insert(r.values.end(), dk.begin(), dk.end());
  r.values.insert(r.values.end(), dv.begin(), dv.end());
  return r;
}

}  // namespace

std::string_view to_string(Pass p) {
  switch (p) {
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
  }
  return "forward";
}

std::optional<Pass> parse_pass(std::string_view name) {
  for (Pass p : kAllPasses)
    if (to_string(p) == name) return p;
  return std::nullopt;
}

std::string_view to_string(InputDistribution d) {
  switch (d) {
    case InputDistribution::normal: return "normal";
    case InputDistribution::uniform: return "uniform";
    case InputDistribution::outliers: return "outliers";
    case InputDistribution::sink: return "sink";
    case InputDistribution::repeated_max: return "repeated_max";
    case InputDistribution::captured: return "captured";
    case InputDistribution::file: return "file";
  }
  return "normal";
}

std::optional<InputDistribution> parse_input_distribution(std::string_view name) {
  for (InputDistribution d : kAllInputDistributions)
    if (to_string(d) == name) return d;
  return std::nullopt;
}

std::string tile_rule_names() { return "paper, swapped, square"; }

std::pair<int, int> paper_tiles(int sram, int head_dim, const std::string& rule) {
  if (sram < 1 || head_dim < 1) throw Error("paper_tiles: the SRAM size and head_dim must be at least 1");
  const std::int64_t wide = (static_cast<std::int64_t>(sram) + 4ll * head_dim - 1) / (4ll * head_dim);  // ceil(M/4d)
  const std::int64_t narrow = std::min<std::int64_t>(wide, head_dim);
  if (rule == "paper") return {static_cast<int>(narrow), static_cast<int>(wide)};
  if (rule == "swapped") return {static_cast<int>(wide), static_cast<int>(narrow)};
  if (rule == "square") return {static_cast<int>(wide), static_cast<int>(wide)};
  throw Error("unknown tile rule '" + rule + "'", "use one of: " + tile_rule_names());
}

std::uint64_t microbench_rounding_seed(const MicrobenchPoint& point) {
  return splitmix64(microbench_seed(point) ^ 0x5EEDF00D5EEDF00Dull);
}

double repeated_max_fraction(const AttentionShape& shape, const PrecisionPolicy& policy, std::uint64_t rounding_seed,
                             const double* q, const double* k) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim, heads = shape.batch * shape.heads;
  const double scale = shape.scale != 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::int64_t repeated = 0;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < n; ++i) {
      const double* qi = q + (h * n + i) * d;
      double best = -INFINITY;
      int count = 0;
      const std::int64_t keys = shape.causal ? i + 1 : n;
      for (std::int64_t j = 0; j < keys; ++j) {
        const double* kj = k + (h * n + j) * d;
        double s = 0;
        for (std::int64_t t = 0; t < d; ++t) s += qi[t] * kj[t];
        const std::uint64_t index = static_cast<std::uint64_t>((h * n + i) * n + j);
        s = round_to(policy.s, s * scale, policy.rounding,
                     static_cast<std::uint32_t>(splitmix64(rounding_seed ^ index)));
        if (s > best) {
          best = s;
          count = 1;
        } else if (s == best) {
          ++count;
        }
      }
      repeated += count >= 2;
    }
  return heads * n > 0 ? static_cast<double>(repeated) / static_cast<double>(heads * n) : 0.0;
}

std::uint64_t microbench_seed(const MicrobenchPoint& point) {
  std::uint64_t h = splitmix64(point.seed);
  h = splitmix64(h ^ static_cast<std::uint64_t>(point.trial));
  h = splitmix64(h ^ static_cast<std::uint64_t>(point.seq_len));
  h = splitmix64(h ^ static_cast<std::uint64_t>(point.head_dim));
  return splitmix64(h ^ fnv1a64(to_string(point.distribution)));
}

void generate_values(std::mt19937_64& rng, InputDistribution distribution, double outlier_fraction,
                     double outlier_scale, double* out, std::size_t n) {
  const double two_pi = 6.283185307179586476925286766559;
  auto normal = [&] {
    const double u1 = 1.0 - uniform01(rng);  // (0, 1]: log(u1) is finite
    const double u2 = uniform01(rng);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
  };
  switch (distribution) {
    case InputDistribution::normal:
    case InputDistribution::sink:
    case InputDistribution::repeated_max:
      for (std::size_t i = 0; i < n; ++i) out[i] = normal();
      return;
    case InputDistribution::uniform: {
      const double half_width = std::sqrt(3.0);
      for (std::size_t i = 0; i < n; ++i) out[i] = (2.0 * uniform01(rng) - 1.0) * half_width;
      return;
    }
    case InputDistribution::outliers:
      for (std::size_t i = 0; i < n; ++i) {
        const double x = normal();
        const double z = normal();  // drawn for every value, so the stream does not depend on the mask
        out[i] = uniform01(rng) < outlier_fraction ? x + outlier_scale * z : x;
      }
      return;
    case InputDistribution::captured:
    case InputDistribution::file: break;
  }
  throw Error("generate_values: distribution \"" + std::string(to_string(distribution)) + "\" is not drawn",
              "captured Q, K, V come from a checkpoint, file ones from a tensor file (prepare_microbench_point's "
              "`captured`)");
}

MicrobenchInputs microbench_inputs(const MicrobenchPoint& point) {
  if (point.batch < 1 || point.heads < 1 || point.seq_len < 1 || point.head_dim < 1) {
    throw Error("microbench point: batch, heads, seq_len and head_dim must be at least 1");
  }
  const std::size_t size = static_cast<std::size_t>(point.batch) * point.heads * point.seq_len * point.head_dim;
  std::mt19937_64 rng(microbench_seed(point));
  MicrobenchInputs in;
  for (std::vector<double>* x : {&in.q, &in.k, &in.v, &in.dout}) {
    x->resize(size);
    // captured, file: Q, K, V (file: and dO) come from the caller (run_microbench_point); dO is normal.
    const bool given = point.distribution == InputDistribution::captured || point.distribution == InputDistribution::file;
    const InputDistribution dist = given ? InputDistribution::normal : point.distribution;
    generate_values(rng, dist, point.outlier_fraction, point.outlier_scale, x->data(), size);
  }
  if (point.distribution == InputDistribution::sink || point.distribution == InputDistribution::repeated_max) {
    const std::int64_t n = point.seq_len, d = point.head_dim;
    const double key0 = point.sink_logit * std::sqrt(static_cast<double>(d));
    // sink: key 0 alone; repeated_max: keys 0 to repeated_keys - 1, all the same vector.
    const std::int64_t sinks = point.distribution == InputDistribution::sink ? 1 : std::min<std::int64_t>(point.repeated_keys, n);
    for (std::int64_t h = 0; h < static_cast<std::int64_t>(point.batch) * point.heads; ++h)
      for (std::int64_t j = 0; j < n; ++j) {
        double* qj = in.q.data() + (h * n + j) * d;
        double* kj = in.k.data() + (h * n + j) * d;
        qj[0] = 1.0;
        if (j < sinks) {
          for (std::int64_t t = 0; t < d; ++t) kj[t] = 0.0;
          kj[0] = key0;
        } else {
          kj[0] = 0.0;
        }
      }
    if (point.distribution == InputDistribution::repeated_max)
      for (double& x : in.v) x -= 1.0;  // N(-1, 1): mostly negative values
  }
  return in;
}

AttentionShape microbench_shape(const MicrobenchPoint& point) {
  return AttentionShape{point.batch, point.heads, point.seq_len, point.head_dim, point.causal};
}

double microbench_cost(const MicrobenchPoint& point) {
  const double n = static_cast<double>(point.seq_len);
  const double work = static_cast<double>(point.batch) * point.heads * n * n * point.head_dim;
  return point.pass == Pass::backward ? 4.0 * work : work;
}

Within2x within_2x(double real_error, double reading_error) {
  if (real_error > 2.0 * reading_error) return Within2x::real_larger;
  if (reading_error > 2.0 * real_error) return Within2x::reading_larger;
  return Within2x::within;
}

std::string_view to_string(Within2x v) {
  switch (v) {
    case Within2x::within: return "within 2x";
    case Within2x::real_larger: return "real > 2x reading";
    case Within2x::reading_larger: return "reading > 2x real";
  }
  return "?";
}

void set_cpu_check(MicrobenchRow& row, const std::vector<double>& values, const std::vector<double>& cpu, bool promised,
                   double bound) {
  const ErrorMetrics d = error_metrics(values, cpu);
  row.vs_cpu = row.point.pass == Pass::backward ? d.rel_l2 : d.max_abs;
  if (promised) {
    // Equal values (both converted exactly from the kernels' floats), compared bit for bit.
    const bool equal = values.size() == cpu.size() &&
                       std::memcmp(values.data(), cpu.data(), values.size() * sizeof(double)) == 0;
    row.check = equal ? "bit-identical" : "DIFFERS";
    row.check_bound = 0;
  } else {
    row.check = row.vs_cpu <= bound ? "within bound" : "EXCEEDS BOUND";
    row.check_bound = bound;
  }
}

const RealCode* find_real_code(std::string_view algorithm) {
  for (const auto& c : kRealCode)
    if (c.algorithm == algorithm) return &c;
  return nullptr;
}

std::string real_code_names(std::string_view device) {
  std::string names;
  for (const auto& c : kRealCode)
    if (c.device == device) names += (names.empty() ? "" : ", ") + std::string(c.algorithm);
  return names;
}

void set_agreement(MicrobenchRow& row, const std::vector<double>& values, const std::vector<double>& reading,
                   const std::string& reading_name) {
  if (values.size() != reading.size()) {
    throw Error("microbench: " + row.algorithm + " has " + std::to_string(values.size()) + " output elements and " +
                reading_name + " " + std::to_string(reading.size()));
  }
  std::size_t identical = 0;
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    // Both values are exact in the format (its outputs, converted to double exactly): equal doubles with
    // the same sign bit are the same bits of the format.
    identical += std::memcmp(&values[i], &reading[i], sizeof(double)) == 0;
    worst = std::max(worst, ulp_distance(row.point.format, values[i], reading[i]));
  }
  row.vs_reading = reading_name;
  row.bit_identical = values.empty() ? 1.0 : static_cast<double>(identical) / static_cast<double>(values.size());
  row.max_ulp_vs = static_cast<double>(worst);
}

MicrobenchRun prepare_microbench_point(const MicrobenchPoint& point, const std::optional<ReadingPolicies>& policies,
                                       int threads, const MicrobenchInputs* captured) {
  MicrobenchRun run;
  run.point = point;
  const ReadingPolicies reading = policies ? *policies : make_reading(point.policy, point.format);
  run.policy = reading.flash;
  run.baseline_policy = reading.baseline;
  if (point.rounding) run.policy.rounding = run.baseline_policy.rounding = *point.rounding;
  const PrecisionPolicy& pol = run.policy;
  const std::uint64_t rounding_seed = microbench_rounding_seed(point);
  MicrobenchInputs raw = microbench_inputs(point);
  if (point.distribution == InputDistribution::captured || point.distribution == InputDistribution::file) {
    const std::size_t n = raw.q.size();
    if (captured == nullptr || captured->q.size() != n || captured->k.size() != n || captured->v.size() != n ||
        (!captured->dout.empty() && captured->dout.size() != n)) {
      throw Error("microbench point: distribution \"" + std::string(to_string(point.distribution)) +
                  "\" needs the given Q, K, V (and dO) of the point's shape (B*H*N*d = " + std::to_string(n) +
                  " values each)");
    }
    raw.q = captured->q;
    raw.k = captured->k;
    raw.v = captured->v;
    if (point.distribution == InputDistribution::file && !captured->dout.empty()) raw.dout = captured->dout;
  }
  run.q = rounded(raw.q, input_format(pol, pol.q));
  run.k = rounded(raw.k, input_format(pol, pol.k));
  run.v = rounded(raw.v, input_format(pol, pol.v));
  run.dout = rounded(raw.dout, pol.grad);
  run.shape = microbench_shape(point);
  const AttentionShape& shape = run.shape;

  run.golden.resize(run.q.size());
  if (point.pass == Pass::forward) {
    attention_forward_reference(shape, run.q.data(), run.k.data(), run.v.data(), run.golden.data(), nullptr);
  } else {
    std::vector<double> dq(run.q.size()), dk(run.q.size()), dv(run.q.size());
    attention_backward_reference(shape, run.q.data(), run.k.data(), run.v.data(), run.dout.data(), dq.data(),
                                 dk.data(), dv.data());
    run.golden = dq;
    run.golden.insert(run.golden.end(), dk.begin(), dk.end());
    run.golden.insert(run.golden.end(), dv.begin(), dv.end());
  }

  run.params.policy = pol;
  run.params.block_q = point.block_q;
  run.params.block_kv = point.block_kv;
  run.params.order = point.loop_order;
  run.params.launch = point.launch;
  run.params.sm_count = point.sm_count;
  run.params.threads = threads;
  run.params.rounding_seed = rounding_seed;
  run.params.head_offset = 0;  // the point runs whole on one rank
  run.float_buffers = !needs_double(pol) && !needs_double(run.baseline_policy);
  run.repeated_max_rows =
      repeated_max_fraction(shape, run.baseline_policy, rounding_seed, run.q.data(), run.k.data());
  return run;
}

MicrobenchRow microbench_row(const MicrobenchRun& run, const std::string& algorithm, const std::vector<double>& values,
                             const std::vector<double>& reference, const AttentionStats& stats) {
  const ErrorMetrics d = error_metrics(values, reference);
  MicrobenchRow r;
  r.algorithm = algorithm;
  r.point = run.point;
  r.rounding = run.policy.rounding;
  r.max_abs = d.max_abs;
  r.mean_abs = d.mean_abs;
  r.std_abs = d.std_abs;
  r.rel_l2 = d.rel_l2;
  r.rmse = d.rmse;
  r.mean_signed = d.mean_signed;
  const double magnitude = max_abs(reference);
  r.max_ulp = magnitude > 0 ? d.max_abs / (unit_roundoff(run.point.format) * magnitude) : 0.0;
  r.repeated_max_rows = run.repeated_max_rows;
  r.rescales_per_row = stats.rescales_per_row;
  r.tiles_kv = stats.tiles_kv;
  return r;
}

std::vector<double> reading_values(const MicrobenchRun& run, std::string_view reading, AttentionKind kind,
                                   int block_q, int block_kv, LoopOrder order) {
  const PrecisionPolicy policy = make_policy(reading, run.point.format, kind);
  AttentionParams params = run.params;
  params.attention = kind;
  params.policy = policy;
  params.block_q = block_q;
  params.block_kv = block_kv;
  params.order = order;
  return needs_double(policy) ? run_kernel<double>(run.point, run.shape, params, run.q, run.k, run.v, run.dout).values
                              : run_kernel<float>(run.point, run.shape, params, run.q, run.k, run.v, run.dout).values;
}

std::vector<double> policy_values(const MicrobenchRun& run, const PrecisionPolicy& policy, AttentionKind kind) {
  AttentionParams params = run.params;
  params.attention = kind;
  params.policy = policy;
  return needs_double(policy) ? run_kernel<double>(run.point, run.shape, params, run.q, run.k, run.v, run.dout).values
                              : run_kernel<float>(run.point, run.shape, params, run.q, run.k, run.v, run.dout).values;
}

std::vector<MicrobenchRow> run_microbench_point(const MicrobenchPoint& point,
                                                const std::optional<ReadingPolicies>& policies, int threads,
                                                const MicrobenchInputs* captured, MicrobenchRun* keep) {
  MicrobenchRun run = prepare_microbench_point(point, policies, threads, captured);
  auto cpu = [&](AttentionKind kind) {
    AttentionParams params = run.params;
    params.attention = kind;
    params.policy = run.policy_of(kind);
    return run.float_buffers ? run_kernel<float>(point, run.shape, params, run.q, run.k, run.v, run.dout)
                             : run_kernel<double>(point, run.shape, params, run.q, run.k, run.v, run.dout);
  };
  run.flash = cpu(AttentionKind::flash);
  run.baseline = cpu(AttentionKind::baseline);
  std::vector<MicrobenchRow> rows{
      microbench_row(run, "flash", run.flash.values, run.golden, run.flash.stats),
      microbench_row(run, "baseline", run.baseline.values, run.golden,
                     run.baseline.stats),
      microbench_row(run, "flash_vs_baseline", run.flash.values, run.baseline.values, run.flash.stats)};
  if (keep != nullptr) *keep = std::move(run);
  return rows;
}

}  // namespace fastudy
