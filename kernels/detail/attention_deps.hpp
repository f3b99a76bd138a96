// What kernels/detail/attention_impl.hpp needs, included by each attention_isa_*.cpp BEFORE it
// switches the target instruction set, so the standard library and the format code stay compiled
// for the portable baseline in every translation unit (one definition, safe on any CPU).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "base/hash.hpp"
#include "kernels/attention.hpp"
#include "kernels/format.hpp"
#include "kernels/round.hpp"
// The models the fa2 reading's vector paths fall back to (kernels/detail/fa2_pytorch.hpp): their
// templates too must be defined for the baseline, or the linker may keep an AVX-512 instance of one for
// every caller.
#include "kernels/fa2_launch.hpp"
#include "kernels/mma_model.hpp"
#include "kernels/nv_math_model.hpp"
