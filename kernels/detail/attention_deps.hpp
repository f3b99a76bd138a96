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
