// libFuzzer: a safetensors file (the 8-byte header length, the JSON header, the buffers) opened and
// read through io::TensorFile.
#include "fuzz_common.hpp"
#include "fuzz_tensor_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastudy::fuzz::read_every_tensor(fastudy::fuzz::write_input("model.safetensors", data, size));
  return 0;
}
