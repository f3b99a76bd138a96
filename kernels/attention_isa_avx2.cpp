// The attention kernels for x86-64 CPUs with AVX2, FMA and F16C (Haswell, Zen and later): 32-byte
// vectors, fused multiply-add in the dot products, fp16 rounding by vcvtps2ph. Compiled through
// `#pragma GCC target` so the rest of the build stays portable; attention.cpp calls these only when
// the CPU has the features.
#include "kernels/detail/attention_deps.hpp"
#include "kernels/detail/attention_isa.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FASTUDY_VEC_BYTES 32
#define FASTUDY_ISA_FMA 1
#define FASTUDY_ISA_F16C 1
#include "kernels/detail/attention_impl.hpp"
#pragma GCC pop_options

namespace fastudy::detail {

const AttentionIsa* attention_isa_avx2() {
  static const AttentionIsa isa{"avx2", &forward_heads<float>, &forward_heads<double>, &backward_heads<float>,
                                &backward_heads<double>};
  return &isa;
}

}  // namespace fastudy::detail
#else
namespace fastudy::detail {
const AttentionIsa* attention_isa_avx2() { return nullptr; }
}  // namespace fastudy::detail
#endif
