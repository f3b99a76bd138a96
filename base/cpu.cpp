#include "base/cpu.hpp"

#include <cstdlib>
#include <string>

#include "base/error.hpp"

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

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::generic: return "generic";
  }
  return "?";
}

int torch_threads_from_env() {
  const char* env = std::getenv("FASTUDY_TORCH_THREADS");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1024) {
    throw UsageError(std::string("FASTUDY_TORCH_THREADS = '") + env + "' is not a thread count",
                     "set it to a positive integer, or unset it to use this rank's share of the CPUs");
  }
  return static_cast<int>(n);
}

}  // namespace fastudy
