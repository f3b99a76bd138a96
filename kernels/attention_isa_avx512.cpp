// The attention kernels for x86-64 CPUs with AVX-512 (F, VL, DQ, BW; Skylake-SP and later): 64-byte
// vectors, fused multiply-add, fp16 rounding by vcvtps2ph. Compiled through `#pragma GCC target`
// like attention_isa_avx2.cpp; attention.cpp prefers it when the CPU has the features.
#include "kernels/detail/attention_deps.hpp"
#include "kernels/detail/attention_isa.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c")
#define FASTUDY_VEC_BYTES 64
#define FASTUDY_ISA_FMA 1
#define FASTUDY_ISA_F16C 1
#include "kernels/detail/attention_impl.hpp"
#pragma GCC pop_options

namespace fastudy::detail {

const AttentionIsa* attention_isa_avx512() {
  static const AttentionIsa isa{"avx512", &forward_heads<float>, &forward_heads<double>, &backward_heads<float>,
                                &backward_heads<double>};
  return &isa;
}

}  // namespace fastudy::detail
#else
namespace fastudy::detail {
const AttentionIsa* attention_isa_avx512() { return nullptr; }
}  // namespace fastudy::detail
#endif
