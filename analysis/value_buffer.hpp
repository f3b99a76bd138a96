// A buffer of trivially copyable values that is reused rather than reallocated: the reduce job's
// read slots, exchange buffers, sort scratch and whole-model shares keep their memory from task to
// task and from step to step, so each page is touched once per reduce, not once per task. Unlike
// std::vector, growing never zero-fills: resize() copies what the buffer holds, assign_uninitialized()
// not even that.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace fastudy {

template <class T>
class ValueBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "ValueBuffer holds plain values");

 public:
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

  // n values; the first min(size(), n) keep their values, the rest are uninitialised. Grows by at
  // least a quarter, so appending in pieces copies each value a bounded number of times.
  void resize(std::size_t n) {
    if (n > capacity_) {
      std::unique_ptr<T[]> grown(new T[std::max(n, capacity_ + capacity_ / 4)]);
      std::copy(data_.get(), data_.get() + size_, grown.get());
      capacity_ = std::max(n, capacity_ + capacity_ / 4);
      data_ = std::move(grown);
    }
    size_ = n;
  }
  // n uninitialised values (nothing is kept).
  void assign_uninitialized(std::size_t n) {
    if (n > capacity_) {
      data_.reset();
      data_.reset(new T[n]);
      capacity_ = n;
    }
    size_ = n;
  }
  // Room for n values, so that growing to n later copies nothing (what it holds is kept).
  void reserve(std::size_t n) {
    const std::size_t keep = size_;
    if (n > capacity_) {
      std::unique_ptr<T[]> grown(new T[n]);
      std::copy(data_.get(), data_.get() + keep, grown.get());
      data_ = std::move(grown);
      capacity_ = n;
    }
  }
  // Appends n values.
  void append(const T* values, std::size_t n) {
    const std::size_t at = size_;
    resize(size_ + n);
    std::copy(values, values + n, data_.get() + at);
  }
  void clear() { size_ = 0; }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace fastudy
