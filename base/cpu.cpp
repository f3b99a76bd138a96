#include "base/cpu.hpp"

namespace fastudy {

Isa cpu_isa() {
  static const Isa isa = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
      return Isa::avx512;
    if (avx2) return Isa::avx2;
#endif
    return Isa::generic;
  }();
  return isa;
}

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::generic: return "generic";
  }
  return "?";
}

}  // namespace fastudy
