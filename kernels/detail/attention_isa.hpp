// The attention kernels are compiled once per instruction set (attention_isa_*.cpp: portable SSE,
// AVX2+FMA+F16C, AVX-512); each such translation unit fills this table, and attention.cpp picks one
// at run time from the CPU's features. Internal to kernels/.
//
// B batch, H heads, N sequence, d head dim; tensors are contiguous [B, H, N, d], lse is [B, H, N].
#pragma once

#include <cstdint>

#include "kernels/attention.hpp"

namespace fastudy::detail {

// Each function runs the heads [head_begin, head_end) of the B*H heads on the calling thread;
// attention.cpp splits the heads over threads. The pointers are the whole [B, H, N, d] tensors.
template <class T>
using ForwardFn = void (*)(const AttentionShape&, const AttentionParams&, const T*, const T*, const T*, T*, T*,
                           std::int64_t head_begin, std::int64_t head_end);
template <class T>
using BackwardFn = void (*)(const AttentionShape&, const AttentionParams&, const T*, const T*, const T*, const T*,
                            const T*, const T*, T*, T*, T*, std::int64_t head_begin, std::int64_t head_end);

struct AttentionIsa {
  const char* name;  // "generic", "avx2", "avx512"
  ForwardFn<float> forward_f32;
  ForwardFn<double> forward_f64;
  BackwardFn<float> backward_f32;
  BackwardFn<double> backward_f64;
};

// Null when the translation unit was built without that instruction set (non-x86 or non-GCC).
const AttentionIsa* attention_isa_generic();
const AttentionIsa* attention_isa_avx2();
const AttentionIsa* attention_isa_avx512();

}  // namespace fastudy::detail
