// libFuzzer: a sharded checkpoint's index (model.safetensors.index.json) beside two valid shards, opened
// and read through io::TensorFile: the index names the shards, which must lie beside it.
#include "fuzz_common.hpp"
#include "fuzz_tensor_file.hpp"

namespace {

// A safetensors file of one F32 tensor `name` of 4 elements.
void write_shard(const std::string& file, const std::string& name) {
  std::string header = "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  const float values[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  fastudy::fuzz::write_input(file, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  write_shard("model-00001-of-00002.safetensors", "a.w");
  write_shard("model-00002-of-00002.safetensors", "b.w");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastudy::fuzz::read_every_tensor(fastudy::fuzz::write_input("model.safetensors.index.json", data, size));
  return 0;
}
