// libFuzzer: a torch.save file (a zip holding data.pkl and the storages) opened and read through
// io::TensorFile with the reader fastudy registers (src/train/torch_file.cpp: the pickle checked by
// io::pickle_problem, then LibTorch's unpickler, then every view checked against its storage).
#include "fuzz_common.hpp"
#include "fuzz_tensor_file.hpp"
#include "src/train/torch_file.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fastudy::train::register_torch_save_reader();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastudy::fuzz::read_every_tensor(fastudy::fuzz::write_input("model.pt", data, size));
  return 0;
}
