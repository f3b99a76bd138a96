// A flat byte codec for what ranks send each other in one MPI job (the microbenchmark's records
// gathered on rank 0, a checkpoint's state broadcast over its group): a fixed-size value travels as
// its bytes in host order, a string as its length (8 bytes) and its bytes. Sender and receiver are the
// same program on the same kind of host, so no byte order is fixed and nothing is versioned: never
// store these bytes in a file. The reader checks every length against what is left and throws Error,
// naming what it reads, on truncated input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace fastudy {

class ByteWriter {
 public:
  // A fixed-size value (an integer, a double, an enum, a struct of those): its bytes.
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "put() takes values of fixed size; put_string() for text");
    put_bytes(&value, sizeof value);
  }
  // A string: its length as std::uint64_t, then its bytes.
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  // n raw bytes (the reader must know n: write it first when it varies).
  void put_bytes(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  // `what` names the bytes in the error on truncated input ("microbench: the records a rank sent").
  ByteReader(const std::string& in, std::string what) : in_(in), what_(std::move(what)) {}

  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>, "get() reads values of fixed size; get_string() for text");
    T value;
    get_bytes(&value, sizeof value);
    return value;
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s = in_.substr(at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return s;
  }
  void get_bytes(void* p, std::size_t n) {
    need(n);
    if (n > 0) std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  // Every byte has been read.
  bool done() const { return at_ == in_.size(); }

 private:
  // Throws Error when fewer than n bytes are left.
  void need(std::uint64_t n) const;

  const std::string& in_;
  std::string what_;
  std::size_t at_ = 0;
};

}  // namespace fastudy
