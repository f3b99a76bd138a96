// The microbenchmark's inputs from a file a user's framework wrote ([microbench] distribution = "file",
// input_file; docs/microbench.md "Real kernels"): tensors named q, k, v and, for the backward pass, do (the
// gradient of O), each of shape [B, H, N, d], in fp64, fp32, fp16 or bf16, in a safetensors file, an
// HDF5 file as h5py writes it, or a torch.save file (src/io/tensor_file.hpp reads them). Everything is
// checked before any work, each problem a UsageError (exit 2) naming the file and the tensor.
//
// B batch, H heads, N sequence, d head dim.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kernels/microbench.hpp"

namespace fastudy {

struct FileInputs {
  std::string path;
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  MicrobenchInputs values;  // q, k, v and dout (dout empty when the file has no `do`), [B, H, N, d]
  std::map<std::string, std::string> stored_types;  // tensor -> the file's word for its element type
};

// The tensor names, in the order they are checked and read.
inline constexpr const char* kFileTensors[] = {"q", "k", "v", "do"};

// Reads and checks `path`: q, k, v present (and do when `backward`: a pass of the sweep is backward),
// each a floating-point tensor of a format fastudy reads, of rank 4 with no empty dimension, k, v and do
// of q's shape, every value finite. `key` names where the path came from in the grid, for the messages
// ("[microbench] sweep 'x': input_file"). A missing, unreadable, truncated or damaged file, or a header
// whose offsets lie, is refused by the reader with the file and tensor named (src/io/tensor_file.hpp).
FileInputs read_microbench_file(const std::string& path, bool backward, const std::string& key);

}  // namespace fastudy
