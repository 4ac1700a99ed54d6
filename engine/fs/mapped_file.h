// POSIX file primitives for the I/O layer (safetensors, token shards,
// checkpoints): a read-only memory mapping of a whole file, and a writer that
// replaces a file atomically (write a temporary, fsync, rename).
//
// Why mmap: model weights and token shards are read many times and can be
// larger than we want to copy; the kernel page cache backs the mapping, so a
// second open of the same file costs no extra memory, and parsers see the
// file as one contiguous byte span (which also makes them fuzzable).
//
// This file is pure C++ (no LibTorch), so it compiles fast and links into the
// fuzz targets.
#ifndef MEGATRAIN_ENGINE_MAPPED_FILE_H_
#define MEGATRAIN_ENGINE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// A read-only, private memory mapping of a whole regular file.
//
// Ownership and lifetime: move-only RAII owner of the mapping; the destructor
// unmaps (never fails, never throws). The file descriptor is closed as soon as
// the mapping exists. The bytes stay at the same address when the object is
// moved, so spans into bytes() stay valid for as long as some MappedFile owns
// the mapping. An empty file (size 0) is represented without a mapping:
// data() is nullptr and bytes() is empty.
//
// Caveat: if another process truncates the file while it is mapped, touching
// the vanished pages raises SIGBUS. Writers in this project replace files by
// rename (AtomicFileWriter), which never truncates a mapped file.
//
// Thread-safety: const methods are safe to call concurrently; the mapped bytes
// are immutable.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
//   absl::Span<const uint8_t> bytes = file.bytes();
class MappedFile {
 public:
  // Maps `path` read-only.
  // Errors: NOT_FOUND when the file does not exist; PERMISSION_DENIED when it
  // cannot be read; INVALID_ARGUMENT when it is not a regular file (e.g. a
  // directory); RESOURCE_EXHAUSTED when the mapping fails for lack of address
  // space or memory; other errno values mapped by absl::ErrnoToStatus. Every
  // message starts with `path`.
  // Opened with OpenInputFile (Note [Confined reads] in dir_fd.h): below
  // the calling thread's ReadConfinement when it has one (PERMISSION_DENIED
  // outside it), and a FIFO or device node is refused without blocking.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  // Maps the file open as `fd`, which it takes over (closed in every case);
  // `path` names it in messages. Errors as Open.
  static absl::StatusOr<MappedFile> OpenDescriptor(int fd, const std::string& path);

  // An empty mapping: size() 0, path() "". Moved-from objects are empty too.
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // First byte of the file; nullptr when the file is empty. Page-aligned.
  const uint8_t* data() const { return data_; }
  // File size in bytes at the time of Open().
  uint64_t size() const { return size_; }
  // The whole file as a byte span.
  absl::Span<const uint8_t> bytes() const {
    return absl::Span<const uint8_t>(data_, static_cast<size_t>(size_));
  }
  // The path given to Open(), for error messages.
  const std::string& path() const { return path_; }

  // Tells the kernel the file will be read front to back (madvise
  // MADV_SEQUENTIAL: larger read-ahead). A hint: failures are ignored.
  void AdviseSequential() const;

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Reset();

  std::string path_;
  const uint8_t* data_ = nullptr;  // mmap result; nullptr when size_ == 0
  uint64_t size_ = 0;              // in bytes
};

// Writes a new file under a temporary name next to `path` and, on Commit(),
// fsyncs it, renames it onto `path` and fsyncs the directory. Readers thus
// see either the old file or the complete new one, never a partial file, and
// a committed file survives a crash.
//
// Ownership and lifetime: move-only owner of the temporary file's descriptor.
// Destroying a writer that was not committed closes and deletes the temporary
// file (never throws; a failed unlink is ignored).
//
// Buffering: small Append()s are gathered in a 1 MiB buffer; appends larger
// than the buffer go straight to write(2) without another copy.
//
// Thread-safety: not thread-safe; use from one thread at a time.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter out,
//                              AtomicFileWriter::Create(path));
//   MEGATRAIN_RETURN_IF_ERROR(out.Append(header_bytes));
//   MEGATRAIN_RETURN_IF_ERROR(out.Commit());
// fsync(2) of a directory, so that entries created, renamed or removed in it
// are durable. Errors carry the errno code and name the directory.
absl::Status FsyncDirectory(const std::string& dir);

// Removes `path` and everything below it, like `rm -rf`, without following
// symbolic links; a missing `path` is OK. Errors carry errno and the path.
//
// Note [No std::filesystem::remove_all]: pip's libtorch.so exports its own
// copy of libstdc++'s std::filesystem, which interposes on the system's in a
// process that loads it; its remove_all jumped to address 0 (checkpoint
// retention on the H100, found with cuda-gdb). Engine code removes trees
// with this function (nftw(3)) instead.
absl::Status RemoveTree(const std::string& path);

// Removes the tree at `path` (RemoveTree, errors ignored) when destroyed,
// unless Release()d first: cleanup of a temporary directory on every error
// path of a function that renames it into place on success. Not copyable.
class RemoveTreeGuard {
 public:
  explicit RemoveTreeGuard(std::string path) : path_(std::move(path)) {}
  RemoveTreeGuard(const RemoveTreeGuard&) = delete;
  RemoveTreeGuard& operator=(const RemoveTreeGuard&) = delete;
  ~RemoveTreeGuard() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// `dir` + "/" + `name` (no doubled slash when `dir` ends in one).
std::string JoinPath(const std::string& dir, absl::string_view name);

class AtomicFileWriter {
 public:
  // Creates the temporary file `<path>.tmp.XXXXXX` (mode 0644) in the
  // directory of `path`. `path` itself is not touched until Commit().
  // Errors: NOT_FOUND when the directory does not exist; PERMISSION_DENIED
  // when it is not writable; others mapped from errno. Messages name `path`.
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends `bytes` to the file.
  // Errors: RESOURCE_EXHAUSTED when the disk is full or a size limit is hit
  // (ENOSPC, EDQUOT, EFBIG; the message ends with the errno name, e.g.
  // "<path>: write: No space left on device (ENOSPC)");
  // FAILED_PRECONDITION after Commit() or after an earlier failed write;
  // others mapped from errno. Messages name `path`.
  absl::Status Append(absl::Span<const uint8_t> bytes);

  // Flushes the buffer, fsyncs, closes and renames the temporary file onto
  // `path`, then fsyncs the directory. After an error the temporary file is
  // deleted and `path` is unchanged.
  // Errors: as Append(); FAILED_PRECONDITION when called twice.
  absl::Status Commit();

  // Bytes appended so far (buffered or written).
  uint64_t bytes_appended() const { return bytes_appended_; }
  // Final path given to Create().
  const std::string& path() const { return path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);
  absl::Status FlushBuffer();
  absl::Status WriteAll(const uint8_t* data, size_t size_bytes);
  void Abandon();

  std::string path_;             // final name
  std::string temp_path_;        // "<path>.tmp.XXXXXX"
  int fd_ = -1;                  // temporary file; -1 once committed or abandoned
  bool failed_ = false;          // an earlier write failed; the file is unusable
  std::vector<uint8_t> buffer_;  // pending bytes, at most kBufferBytes
  uint64_t bytes_appended_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MAPPED_FILE_H_
