#include "base/dtype.hpp"

namespace fastudy {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 1;
}

std::string_view to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

}  // namespace fastudy
