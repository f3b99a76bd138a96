// The element types of the arrays fastudy stores (checkpoint tensors, HDF5 datasets): plain data,
// known to every layer that reads or writes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fastudy {

enum class DType : std::uint8_t { f32, f64, i64, u8 };
std::size_t dtype_size(DType t);
std::string_view to_string(DType t);

}  // namespace fastudy
