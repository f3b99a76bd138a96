// libFuzzer: a checksum sidecar ("fastudy-crc32/1 SIZE CRC32", one or two lines) of a fixed file, read
// by checksum_problem and read_sealed as every reader of a study's files reads it first. Any bytes give
// an answer (a match or a named problem), never a crash.
#include "base/checksum.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string text = "step,state\n4,done\n";
  fastudy::fuzz::write_input("status.csv", reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastudy::fuzz::write_input("status.csv.crc", data, size);
  const std::string file = (fastudy::fuzz::scratch() / "status.csv").string();
  (void)fastudy::checksum_problem(file);
  try {
    (void)fastudy::read_sealed(file, "");
  } catch (const fastudy::IntegrityError&) {
  }
  return 0;
}
