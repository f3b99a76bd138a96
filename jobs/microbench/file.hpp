// The microbenchmark's inputs from a file a user's framework wrote ([microbench] distribution = "file",
// input_file; docs/microbench.md "Real kernels"): tensors named q, k, v and, for the backward pass, do (the
// gradient of O), each of shape [B, H, N, d], in fp64, fp32, fp16 or bf16, in a safetensors file, an
// HDF5 file as h5py writes it, or a torch.save file (src/io/tensor_file.hpp reads them). The file may
// also hold the outputs of the user's own kernel on those inputs, any subset of o, dq, dk, dv ([B, H, N,
// d], all in one format) and lse ([B, H, N], the natural-log log-sum-exp of each row): the microbench job
// then adds a "file" row beside every reading of the point. Everything is checked before any work, each
// problem a UsageError (exit 2) naming the file and the tensor.
//
// B batch, H heads, N sequence, d head dim.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/microbench.hpp"

namespace fastudy {

struct FileInputs {
  std::string path;
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  MicrobenchInputs values;  // q, k, v and dout (dout empty when the file has no `do`), [B, H, N, d]
  std::map<std::string, std::string> stored_types;  // tensor -> the file's word for its element type
  // The user's outputs, each empty when the file does not hold it: o, dq, dk, dv [B, H, N, d] in
  // output_format, lse [B, H, N].
  std::vector<double> o, lse, dq, dk, dv;
  std::optional<Format> output_format;  // the format of o, dq, dk and dv; nullopt when none is there
  bool has_outputs() const { return !o.empty() || !lse.empty() || !dq.empty() || !dk.empty() || !dv.empty(); }
};

// The tensor names, in the order they are checked and read: the inputs, then the optional outputs.
inline constexpr const char* kFileTensors[] = {"q", "k", "v", "do"};
inline constexpr const char* kFileOutputs[] = {"o", "lse", "dq", "dk", "dv"};

// The shape [B, H, N, d] of the file's q (read from the header alone, for expanding the points);
// UsageError as read_microbench_file for a missing or unreadable file or a q that is not [B, H, N, d].
struct FileShape {
  std::int64_t batch = 0, heads = 0, seq_len = 0, head_dim = 0;
};
FileShape microbench_file_shape(const std::string& path, const std::string& key);

// Reads and checks `path`: q, k, v present (and do when `backward`: a pass of the sweep is backward),
// each a floating-point tensor of a format fastudy reads, of rank 4 with no empty dimension, k, v and do
// of q's shape, every value finite; the outputs present each a floating-point tensor, o, dq, dk and dv of
// q's shape, all in one format and finite, lse of shape [B, H, N] with no NaN (an empty row's lse is
// +-inf). `key` names where the path came from in the grid, for the messages
// ("[microbench] sweep 'x': input_file"). A missing, unreadable, truncated or damaged file, or a header
// whose offsets lie, is refused by the reader with the file and tensor named (src/io/tensor_file.hpp).
FileInputs read_microbench_file(const std::string& path, bool backward, const std::string& key);

// The "file" row of a point prepared on the file's inputs whose reading ran (run.flash): the user's
// outputs of the point's pass (forward: o, and lse; backward: dq, dk, dv, those the file holds) against
// the fp64 golden value (the metrics, over the present tensors of O or dQ|dK|dV; NaN when the file holds
// none of them, an lse alone), and against the reading's flash kernel, element by element: per tensor
// (MicrobenchRow::o, lse, dq, dk, dv) and over the tensors of the metrics (bit_identical, max_ulp_vs);
// vs_reading "<policy> flash". Null when the file holds no output of the pass, or its outputs' format is
// not the one the reading stores them in (o on forward points, grad on backward ones).
std::optional<MicrobenchRow> microbench_file_row(const MicrobenchRun& run, const FileInputs& in);

}  // namespace fastudy
