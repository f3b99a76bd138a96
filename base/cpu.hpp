// The instruction set fastudy's hot loops run with, decided once per process and in one place: the
// attention kernels (kernels/, one translation unit per ISA) and the distance kernels (analysis/,
// one function per ISA) are each compiled for every ISA below and call the variant cpu_isa() names.
// Every variant rounds identically (no FMA contraction), so the choice changes speed, never results.
#pragma once

#include <string_view>

namespace fastudy {

enum class Isa { generic, avx2, avx512 };

// avx512: AVX-512 F/VL/DQ/BW with AVX2, FMA, F16C; avx2: AVX2, FMA, F16C; generic otherwise (and on
// compilers or architectures without GCC's x86 target attributes).
Isa cpu_isa();
std::string_view to_string(Isa isa);

// The training threads asked for by FASTUDY_TORCH_THREADS: 0 when it is unset or empty (the trainer
// then uses the rank's share of the CPUs), else its count in [1, 1024]. Throws UsageError naming
// the variable for any other value.
int torch_threads_from_env();

// Whether this build compiles per-ISA variants at all (GCC on x86-64, without AddressSanitizer).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define FASTUDY_PER_ISA 1
#else
#define FASTUDY_PER_ISA 0
#endif

}  // namespace fastudy
