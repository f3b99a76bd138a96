// tests/kernels/fa2_pytorch_lanes_checks.hpp on the portable build of kernels/detail/fa2_pytorch.hpp:
// 16-byte vectors, no FMA, as kernels/attention_isa_generic.cpp compiles them (every CPU runs it).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "kernels/detail/attention_deps.hpp"

#define FASTUDY_VEC_BYTES 16
#define FASTUDY_ISA_FMA 0
#define FASTUDY_ISA_F16C 0
#include "kernels/detail/vec.hpp"
#include "kernels/detail/round_vec.hpp"
#include "kernels/detail/fa2_pytorch.hpp"
#include "tests/kernels/fa2_pytorch_lanes_checks.hpp"

FASTUDY_FA2_LANES_TESTS(Fa2PytorchLanesGeneric, true)
