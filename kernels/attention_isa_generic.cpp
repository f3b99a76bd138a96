// The attention kernels for any CPU: 16-byte vectors (SSE2 on x86-64, NEON elsewhere), no FMA.
// attention.cpp falls back to these when the CPU lacks AVX2/FMA/F16C.
#include "kernels/detail/attention_deps.hpp"
#include "kernels/detail/attention_isa.hpp"

#define FASTUDY_VEC_BYTES 16
#define FASTUDY_ISA_FMA 0
#define FASTUDY_ISA_F16C 0
#include "kernels/detail/attention_impl.hpp"

namespace fastudy::detail {

const AttentionIsa* attention_isa_generic() {
  static const AttentionIsa isa{"generic", &forward_heads<float>, &forward_heads<double>, &backward_heads<float>,
                                &backward_heads<double>};
  return &isa;
}

}  // namespace fastudy::detail
