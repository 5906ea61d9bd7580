// Read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace swiftlet {

// How a file's bytes come into memory. Map: mapped, pages read on first touch (start-up does
// no IO; the page cache is the only copy). Populate: mapped and read ahead at open
// (MAP_POPULATE). Read: read into anonymous memory with O_DIRECT (one private copy, no page
// cache), falling back to buffered reads where O_DIRECT is refused.
enum class Residency { Map, Populate, Read };
// "map", "populate" or "read"; throws Error otherwise.
Residency parse_residency(const std::string& s);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. Throws Error naming the file when it cannot be opened or mapped.
  // Should the file be truncated while mapped, reading a lost page raises SIGBUS: a handler
  // then names the file on stderr before the process dies of it.
  explicit MappedFile(const std::string& path, Residency mode = Residency::Map);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // An address range of `size` bytes for `path` before the file is there (a checkpoint shard
  // still to be downloaded): data() is stable from now on, and reading it faults until attach().
  static MappedFile reserve(const std::string& path, size_t size);
  // Maps the file, which must now have the reserved size, over the reserved range. Throws Error
  // naming the file otherwise.
  void attach();
  // Unmaps the file and keeps the range reserved (reading it faults again): the file can go.
  void detach();
  bool attached() const { return attached_; }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool anonymous_ = false;  // Residency::Read
  bool attached_ = false;   // false only for a reserve()d range without its file
};

// Reads a whole (small) file into a string. Throws Error naming the file on failure.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace swiftlet
