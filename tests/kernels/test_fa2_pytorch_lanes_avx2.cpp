// tests/kernels/fa2_pytorch_lanes_checks.hpp on the AVX2 build of kernels/detail/fa2_pytorch.hpp: 32-byte
// vectors under the target kernels/attention_isa_avx2.cpp compiles them for, run where the CPU has it.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "kernels/detail/attention_deps.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FASTUDY_VEC_BYTES 32
#define FASTUDY_ISA_FMA 1
#define FASTUDY_ISA_F16C 1
#include "kernels/detail/vec.hpp"
#include "kernels/detail/round_vec.hpp"
#include "kernels/detail/fa2_pytorch.hpp"
#include "tests/kernels/fa2_pytorch_lanes_checks.hpp"
#pragma GCC pop_options

FASTUDY_FA2_LANES_TESTS(Fa2PytorchLanesAvx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                                 __builtin_cpu_supports("f16c"))
#endif
