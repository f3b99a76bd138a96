// A whole file mapped read-only into memory (mmap), for readers of large files written by other
// programs (safetensors checkpoints): the bytes are read from the page cache on first touch, never
// copied. The one place the project calls mmap/munmap. Move-only; unmapped on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastudy {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` (a regular file) read-only. An empty file maps to size() 0 and data() nullptr.
  // Throws UsageError naming the file when it is missing, not a regular file or unreadable.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void unmap() noexcept;
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace fastudy
