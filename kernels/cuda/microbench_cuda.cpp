// Our CUDA kernels as microbenchmark algorithms (see microbench_cuda.hpp).
#include "kernels/cuda/microbench_cuda.hpp"

#include <cuda_runtime_api.h>

#include "kernels/check.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/tile_dispatch.hpp"

namespace fastudy::cuda {
namespace {

// A float device copy of host values (already representable in the policy's storage format: the
// kernels take fp32 tensors and round on load, which leaves them unchanged).
DeviceBuffer<float> upload(const std::vector<double>& x) {
  const std::vector<float> f(x.begin(), x.end());
  DeviceBuffer<float> b(f.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(b.get(), f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

void append(std::vector<double>& out, const DeviceBuffer<float>& b) {
  std::vector<float> f(b.size());
  FASTUDY_CUDA_CHECK(cudaMemcpy(f.data(), b.get(), f.size() * sizeof(float), cudaMemcpyDeviceToHost));
  out.insert(out.end(), f.begin(), f.end());
}

}  // namespace

bool cpu_bit_identity_promised(const MicrobenchRun& run, AttentionKind kind) {
  bool tensor_cores = false;
  cuda_tile::dispatch_tile_rounding(run.policy_of(kind), [&](auto rd) { tensor_cores = decltype(rd)::kMma; });
  return run.float_buffers && attention_isa_name() != "generic" && !tensor_cores;
}

std::vector<MicrobenchRow> microbench_cuda_rows(const MicrobenchRun& run,
                                                std::map<std::string, std::vector<double>>* saved) {
  // UsageError naming the policy when the kernels lack one of the two.
  cuda_tile::tile_storage_format(run.policy);
  cuda_tile::tile_storage_format(run.baseline_policy);
  if (run.flash.values.empty() || run.baseline.values.empty())
    throw Error("microbench_cuda_rows: the CPU kernels have not run on this point");
  const bool backward = run.point.pass == Pass::backward;
  const double smag = score_magnitude(run.shape, run.q, run.k);
  const DeviceBuffer<float> q = upload(run.q), k = upload(run.k), v = upload(run.v);
  const std::size_t size = run.q.size(), rows = run.flash.lse.size();

  std::vector<MicrobenchRow> out;
  for (const AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
    const MicrobenchKernelOutput& cpu = kind == AttentionKind::flash ? run.flash : run.baseline;
    AttentionParams params = run.params;
    params.attention = kind;
    params.policy = run.policy_of(kind);
    const double bound = backward ? 2.0 * backward_bound(params.policy, run.shape, Format::fp32, smag)
                                  : 2.0 * forward_bound(params.policy, run.shape, Format::fp32, smag,
                                                        max_abs(run.v), run.point.block_kv);
    std::vector<double> values;
    AttentionStats stats = cpu.stats;
    if (!backward) {
      DeviceBuffer<float> o(size), lse(rows);
      stats = attention_forward_cuda(run.shape, params, Format::fp32, q.get(), k.get(), v.get(), o.get(), lse.get());
      append(values, o);
    } else {
      const DeviceBuffer<float> o = upload(cpu.o), lse = upload(cpu.lse), dout = upload(run.dout);
      DeviceBuffer<float> dq(size), dk(size), dv(size);
      attention_backward_cuda(run.shape, params, Format::fp32, q.get(), k.get(), v.get(), o.get(), lse.get(),
                              dout.get(), dq.get(), dk.get(), dv.get());
      append(values, dq);
      append(values, dk);
      append(values, dv);
    }
    MicrobenchRow row = microbench_row(run, kind == AttentionKind::flash ? "cuda_flash" : "cuda_baseline", values,
                                       run.golden, stats);
    set_cpu_check(row, values, cpu.values, cpu_bit_identity_promised(run, kind), bound);
    if (saved != nullptr) (*saved)[row.algorithm] = values;
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace fastudy::cuda
