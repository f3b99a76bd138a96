// libFuzzer: the pickle program of a torch.save file (its data.pkl) through io::pickle_problem alone,
// which must accept or refuse any bytes in time linear in their length.
#include <cstddef>
#include <cstdint>

#include "src/io/pickle_scan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)fastudy::io::pickle_problem(reinterpret_cast<const char*>(data), size);
  return 0;
}
