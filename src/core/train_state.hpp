// The state of one training variant at one step: everything a checkpoint holds and a resume needs.
//
// The trainer (src/train, LibTorch) fills it; the checkpoint writer (src/io, parallel HDF5) stores
// it; the reducer reads the parameters back. It is plain data so that neither side needs the other's
// library: no LibTorch and no HDF5 here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/dtype.hpp"

namespace fastudy {

// A named, shaped, contiguous array. Names are module paths ("blocks.0.attn.qkv.weight") or, for
// optimizer state, "<param>.exp_avg" / "<param>.exp_avg_sq".
struct NamedArray {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::f32;
  std::vector<std::byte> data;  // numel * dtype_size(dtype) bytes, native little-endian

  std::int64_t numel() const;
  template <class T> T* as() { return reinterpret_cast<T*>(data.data()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

struct TrainState {
  std::int64_t step = 0;                 // optimizer steps completed
  std::vector<NamedArray> params;        // master weights (fp32; fp64 for an fp64 variant)
  std::vector<NamedArray> optimizer;     // AdamW moments, same dtype as params
  std::vector<NamedArray> extra;         // anything else needed to resume exactly (RNG states, ...)
  std::int64_t data_cursor = 0;          // batches consumed from the data stream
  double loss_scale = 1.0;               // fp16 dynamic loss scale (1 otherwise)
  std::int64_t good_steps = 0;           // fp16: finite steps since the last scale change
  std::vector<double> loss_history;      // training loss of every step so far
  std::map<std::string, std::string> attrs;  // variant id, axis values, config hash, format version
};

}  // namespace fastudy
