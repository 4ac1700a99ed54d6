// Read-only file mapping and atomic file replacement (see mapped_file.h).
#include "engine/fs/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/fs/dir_fd.h"

namespace megatrain::engine {
namespace {

// Gathers small appends; 1 MiB keeps the syscall count low without holding
// much memory (several writers may be open at once, e.g. checkpoint shards).
constexpr size_t kBufferBytes = size_t{1} << 20;

// Largest single write(2): Linux transfers at most 0x7ffff000 bytes per call.
constexpr size_t kMaxWriteBytes = size_t{1} << 30;

absl::Status ErrnoError(int error_number, const std::string& path, const char* operation) {
  return absl::ErrnoToStatus(error_number, absl::StrFormat("%s: %s", path, operation));
}

// Maps disk-full conditions to RESOURCE_EXHAUSTED, the rest through absl.
// The message carries the errno name too ("No space left on device
// (ENOSPC)"), which operators grep for. EFBIG: the file size limit
// (RLIMIT_FSIZE, `ulimit -f`) or the file system's maximum file size.
absl::Status WriteErrnoError(int error_number, const std::string& path, const char* operation) {
  const char* name = error_number == ENOSPC   ? "ENOSPC"
                     : error_number == EDQUOT ? "EDQUOT"
                     : error_number == EFBIG  ? "EFBIG"
                                              : nullptr;
  if (name != nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: %s: %s (%s)", path, operation, std::strerror(error_number), name));
  }
  return ErrnoError(error_number, path, operation);
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

// ---------------------------------------------------------------------------
// MappedFile

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // Note [Confined reads] in dir_fd.h: below the job's roots when the thread
  // has a confinement; never blocks on a FIFO; regular files only.
  absl::StatusOr<int> opened = OpenInputFile(path);
  if (!opened.ok()) return opened.status();
  return OpenDescriptor(*opened, path);
}

absl::StatusOr<MappedFile> MappedFile::OpenDescriptor(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error_number = errno;
    ::close(fd);
    return ErrnoError(error_number, path, "fstat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("%s: not a regular file", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return MappedFile(path, nullptr, 0);
  }
  void* addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // The mapping keeps its own reference to the file.
  if (addr == MAP_FAILED) {
    if (mmap_errno == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: mmap of %u bytes: %s", path, size, std::strerror(mmap_errno)));
    }
    return ErrnoError(mmap_errno, path, "mmap");
  }
  return MappedFile(path, static_cast<const uint8_t*>(addr), size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) {
    // munmap only fails for invalid arguments, which would be a bug here;
    // a destructor has nobody to report it to.
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  }
  data_ = nullptr;
  size_ = 0;
  path_.clear();
}

void MappedFile::AdviseSequential() const {
  if (data_ != nullptr) {
    ::madvise(const_cast<uint8_t*>(data_), static_cast<size_t>(size_), MADV_SEQUENTIAL);
  }
}

// ---------------------------------------------------------------------------
// AtomicFileWriter

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrFormat("'%s': not a file path", path));
  }
  std::string temp_path = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temp_path.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, path, "create temporary file");
  // mkostemp creates 0600; published files are world-readable like any
  // other output of the trainer.
  if (::fchmod(fd, 0644) != 0) {
    const int error_number = errno;
    ::close(fd);
    ::unlink(temp_path.c_str());
    return ErrnoError(error_number, temp_path, "fchmod");
  }
  return AtomicFileWriter(path, std::move(temp_path), fd);
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {
  buffer_.reserve(kBufferBytes);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      failed_(other.failed_),
      buffer_(std::move(other.buffer_)),
      bytes_appended_(other.bytes_appended_) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    failed_ = other.failed_;
    buffer_ = std::move(other.buffer_);
    bytes_appended_ = other.bytes_appended_;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    fd_ = -1;
  }
}

absl::Status AtomicFileWriter::WriteAll(const uint8_t* data, size_t size_bytes) {
  while (size_bytes > 0) {
    const size_t chunk = size_bytes < kMaxWriteBytes ? size_bytes : kMaxWriteBytes;
    const ssize_t written = ::write(fd_, data, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      failed_ = true;
      return WriteErrnoError(errno, path_, "write");
    }
    data += written;
    size_bytes -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::FlushBuffer() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status status = WriteAll(buffer_.data(), buffer_.size());
  buffer_.clear();
  return status;
}

absl::Status AtomicFileWriter::Append(absl::Span<const uint8_t> bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrFormat("%s: Append after Commit", path_));
  }
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrFormat("%s: Append after a failed write", path_));
  }
  bytes_appended_ += bytes.size();
  if (buffer_.size() + bytes.size() <= kBufferBytes) {
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    return absl::OkStatus();
  }
  absl::Status status = FlushBuffer();
  if (!status.ok()) return status;
  if (bytes.size() >= kBufferBytes) return WriteAll(bytes.data(), bytes.size());
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrFormat("%s: Commit called twice", path_));
  }
  if (failed_) {
    Abandon();
    return absl::FailedPreconditionError(absl::StrFormat("%s: Commit after a failed write", path_));
  }
  absl::Status status = FlushBuffer();
  if (status.ok() && ::fsync(fd_) != 0) {
    status = WriteErrnoError(errno, path_, "fsync");
  }
  if (!status.ok()) {
    Abandon();
    return status;
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error_number = errno;
    ::unlink(temp_path_.c_str());
    return WriteErrnoError(error_number, path_, "close");
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(temp_path_.c_str());
    return ErrnoError(error_number, path_, "rename");
  }
  // Make the new directory entry durable too.
  return FsyncDirectory(DirectoryOf(path_));
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, dir, "open directory for fsync");
  const int sync_result = ::fsync(dir_fd);
  const int sync_errno = errno;
  ::close(dir_fd);
  if (sync_result != 0) return ErrnoError(sync_errno, dir, "fsync directory");
  return absl::OkStatus();
}

namespace {
int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 ? 0 : -1;
}
}  // namespace

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(errno, path, "stat");
  }
  if (::nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS) != 0) {
    return ErrnoError(errno, path, "remove tree");
  }
  return absl::OkStatus();
}

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty() || dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace megatrain::engine
