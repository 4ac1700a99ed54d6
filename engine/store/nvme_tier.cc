// The NVMe tier (nvme_tier.h): mode names, the moment files and their
// read-ahead / write-behind pass.
#include "engine/store/nvme_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/store/shard_layout.h"
#include "engine/fs/dir_fd.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// O_DIRECT needs offsets, lengths and buffers aligned to the logical block
// size; 4 KiB covers every SSD (512 B or 4 KiB sectors).
constexpr int64_t kAlignElements = 1024;
constexpr int64_t kAlignBytes = kAlignElements * 4;

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace

struct NvmeMomentFiles::Ring {
  struct io_uring ring;
};

namespace {

// The outstanding I/O of one pass: at most one read or one write per
// (slot, kind) at a time. Submits to io_uring when there is a ring, else
// does the I/O at once (pread/pwrite). Not thread-safe.
class PassIo {
 public:
  using Issue = std::function<absl::Status(bool write, MomentKind kind, int64_t offset_bytes,
                                           int64_t bytes, void* buf)>;
  PassIo(struct io_uring* ring, const std::string* paths, std::atomic<int64_t>* read_total,
         std::atomic<int64_t>* written_total, Issue sync)
      : ring_(ring),
        paths_(paths),
        read_total_(read_total),
        written_total_(written_total),
        sync_(std::move(sync)) {}

  // Starts the read or write of `bytes` at `offset_bytes` of `kind`'s file
  // into / from `buf` on `slot`.
  absl::Status Start(int slot, bool write, MomentKind kind, int64_t offset_bytes, int64_t bytes,
                     void* buf) {
    if (ring_ == nullptr) return sync_(write, kind, offset_bytes, bytes, buf);
    struct io_uring_sqe* sqe = io_uring_get_sqe(ring_);
    if (sqe == nullptr) return absl::InternalError("NVMe tier: io_uring submission queue full");
    const int k = static_cast<int>(kind);
    if (write) {
      io_uring_prep_write(sqe, fds_[k], buf, static_cast<unsigned>(bytes), offset_bytes);
    } else {
      io_uring_prep_read(sqe, fds_[k], buf, static_cast<unsigned>(bytes), offset_bytes);
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot * 2 + k));
    Op& op = ops_[slot * 2 + k];
    op = Op{write, offset_bytes, bytes, true};
    ++pending_;
    const int submitted = io_uring_submit(ring_);
    if (submitted < 0) return FileErrnoStatus(-submitted, paths_[k], "io_uring_submit");
    return absl::OkStatus();
  }

  // Waits until nothing is outstanding on `slot`; the first error seen.
  absl::Status Wait(int slot) {
    while (ops_[slot * 2].busy || ops_[slot * 2 + 1].busy) {
      MEGATRAIN_RETURN_IF_ERROR(Reap());
    }
    return absl::OkStatus();
  }
  // Waits for everything; keeps reaping after an error (the buffers must
  // be idle before they are reused or freed) and returns the first one.
  absl::Status Drain() {
    absl::Status first;
    while (pending_ > 0) {
      absl::Status s = Reap();
      if (first.ok()) first = s;
    }
    return first;
  }
  void set_fds(int exp_avg_fd, int exp_avg_sq_fd) { fds_[0] = exp_avg_fd, fds_[1] = exp_avg_sq_fd; }

 private:
  struct Op {
    bool write = false;
    int64_t offset_bytes = 0;
    int64_t bytes = 0;
    bool busy = false;
  };

  // Takes one completion; its error, naming the file.
  absl::Status Reap() {
    struct io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring_, &cqe);
    if (rc < 0) return absl::InternalError(absl::StrCat("io_uring_wait_cqe: ", std::strerror(-rc)));
    const int index = static_cast<int>(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ring_, cqe);
    Op& op = ops_[index];
    op.busy = false;
    --pending_;
    const std::string& path = paths_[index % 2];
    if (res < 0) {
      return op.write
                 ? FileErrnoStatus(-res, path, absl::StrCat("write at offset ", op.offset_bytes))
                 : absl::DataLossError(absl::StrCat(path, ": read at offset ", op.offset_bytes,
                                                    ": ", std::strerror(-res)));
    }
    (op.write ? written_total_ : read_total_)->fetch_add(res);
    if (res != op.bytes) {
      return op.write ? absl::ResourceExhaustedError(absl::StrCat(path, ": wrote ", res, " of ",
                                                                  op.bytes, " bytes at offset ",
                                                                  op.offset_bytes, " (disk full?)"))
                      : absl::DataLossError(absl::StrCat(path, ": read ", res, " of ", op.bytes,
                                                         " bytes at offset ", op.offset_bytes,
                                                         ": file truncated"));
    }
    return absl::OkStatus();
  }

  struct io_uring* ring_;
  const std::string* paths_;
  std::atomic<int64_t>* read_total_;
  std::atomic<int64_t>* written_total_;
  Issue sync_;
  int fds_[2] = {-1, -1};
  Op ops_[kNvmeTierBuffers * 2];
  int pending_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeMomentFiles>> NvmeMomentFiles::Create(
    const std::string& dir, int64_t numel, bool pin_staging, int64_t chunk_elements,
    const std::string& display_dir, const std::string& name_suffix) {
  if (numel <= 0 || numel % kAlignElements != 0 || chunk_elements <= 0 ||
      chunk_elements % kAlignElements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe tier: numel and chunk_elements must be positive multiples of 1024, got ",
                     numel, " and ", chunk_elements));
  }
  std::unique_ptr<NvmeMomentFiles> files(new NvmeMomentFiles());
  files->numel_ = numel;
  files->chunk_elements_ = chunk_elements;
  files->direct_ = true;
  const std::string names[2] = {absl::StrCat("exp_avg", name_suffix, ".bin"),
                                absl::StrCat("exp_avg_sq", name_suffix, ".bin")};
  for (int k = 0; k < 2; ++k) {
    File& f = files->files_[k];
    f.path = absl::StrCat(display_dir.empty() ? dir : display_dir, "/", names[k]);
    const std::string open_path = absl::StrCat(dir, "/", names[k]);
    const int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW;
    f.fd = files->direct_ ? ::open(open_path.c_str(), flags | O_DIRECT, 0600) : -1;
    if (f.fd < 0 && (!files->direct_ || errno == EINVAL)) {
      // Note [NVMe tier]: tmpfs and some file systems refuse O_DIRECT.
      files->direct_ = false;
      f.fd = ::open(open_path.c_str(), flags, 0600);
    }
    if (f.fd < 0) return FileErrnoStatus(errno, f.path, "open");
    if (::ftruncate(f.fd, numel * 4) != 0) return FileErrnoStatus(errno, f.path, "ftruncate");
  }
  if (!files->direct_) {
    // The first file may have been opened with O_DIRECT before the second
    // was refused: one mode for both.
    const int fl = ::fcntl(files->files_[0].fd, F_GETFL);
    if (fl >= 0) ::fcntl(files->files_[0].fd, F_SETFL, fl & ~O_DIRECT);
  }
  MEGATRAIN_ASSIGN_OR_RETURN(
      files->staging_,
      HostBuffer::Allocate(static_cast<size_t>(kNvmeTierBuffers * 2 * chunk_elements * 4),
                           pin_staging));
  auto ring = std::make_unique<Ring>();
  if (io_uring_queue_init(4 * kNvmeTierBuffers, &ring->ring, 0) == 0) {
    files->ring_ = ring.release();
  }  // else: pread/pwrite (io_uring disabled by seccomp or an old kernel)
  return files;
}

NvmeMomentFiles::~NvmeMomentFiles() {
  if (ring_ != nullptr) {
    io_uring_queue_exit(&ring_->ring);
    delete ring_;
  }
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

absl::Status NvmeMomentFiles::SyncIo(bool write, MomentKind kind, int64_t offset, int64_t bytes,
                                     void* buf) {
  const File& f = files_[static_cast<int>(kind)];
  int64_t done = 0;
  while (done < bytes) {
    char* p = static_cast<char*>(buf) + done;
    const ssize_t n = write ? ::pwrite(f.fd, p, bytes - done, offset + done)
                            : ::pread(f.fd, p, bytes - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return write ? FileErrnoStatus(errno, f.path, absl::StrCat("write at offset ", offset + done))
                   : absl::DataLossError(absl::StrCat(f.path, ": read at offset ", offset + done,
                                                      ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return write ? absl::ResourceExhaustedError(
                         absl::StrCat(f.path, ": wrote 0 bytes at offset ", offset + done))
                   : absl::DataLossError(absl::StrCat(f.path, ": read ", done, " of ", bytes,
                                                      " bytes at offset ", offset,
                                                      ": file truncated"));
    }
    (write ? bytes_written_ : bytes_read_).fetch_add(n);
    done += n;
  }
  return absl::OkStatus();
}

absl::Status NvmeMomentFiles::ForEachChunk(const std::vector<MomentRange>& ranges,
                                           const ChunkFn& fn) {
  std::vector<MomentRange> chunks;
  for (const MomentRange& r : ranges) {
    if (r.offset < 0 || r.count < 0 || r.offset % kAlignElements != 0 ||
        r.offset + AlignUp(r.count, kAlignElements) > numel_) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe tier: range [", r.offset, ", +", r.count,
                                                     ") is not 4 KiB-aligned inside the ", numel_,
                                                     " elements of the moment files"));
    }
    for (int64_t begin = 0; begin < r.count; begin += chunk_elements_) {
      chunks.push_back({r.offset + begin, std::min(chunk_elements_, r.count - begin)});
    }
  }
  float* base = static_cast<float*>(staging_.data());
  auto buffer = [&](int64_t slot, int kind) { return base + (slot * 2 + kind) * chunk_elements_; };
  const std::string paths[2] = {files_[0].path, files_[1].path};
  PassIo io(ring_ != nullptr ? &ring_->ring : nullptr, paths, &bytes_read_, &bytes_written_,
            [this](bool write, MomentKind kind, int64_t offset, int64_t bytes, void* buf) {
              return SyncIo(write, kind, offset, bytes, buf);
            });
  io.set_fds(files_[0].fd, files_[1].fd);
  // Both moments of chunk `i` into or out of its slot.
  auto start = [&](int64_t i, bool write) -> absl::Status {
    const int slot = static_cast<int>(i % kNvmeTierBuffers);
    const int64_t bytes = AlignUp(chunks[i].count, kAlignElements) * 4;
    for (int k = 0; k < 2; ++k) {
      MEGATRAIN_RETURN_IF_ERROR(io.Start(slot, write, static_cast<MomentKind>(k),
                                         chunks[i].offset * 4, bytes, buffer(slot, k)));
    }
    return absl::OkStatus();
  };
  auto run = [&]() -> absl::Status {
    if (chunks.empty()) return absl::OkStatus();
    MEGATRAIN_RETURN_IF_ERROR(start(0, /*write=*/false));
    for (int64_t i = 0; i < static_cast<int64_t>(chunks.size()); ++i) {
      const int slot = static_cast<int>(i % kNvmeTierBuffers);
      if (i + 1 < static_cast<int64_t>(chunks.size())) {
        // The next slot's last write (chunk i + 1 - kNvmeTierBuffers) must
        // be done before its read lands there.
        MEGATRAIN_RETURN_IF_ERROR(io.Wait(static_cast<int>((i + 1) % kNvmeTierBuffers)));
        MEGATRAIN_RETURN_IF_ERROR(start(i + 1, /*write=*/false));
      }
      MEGATRAIN_RETURN_IF_ERROR(io.Wait(slot));
      MEGATRAIN_RETURN_IF_ERROR(fn(chunks[i], buffer(slot, 0), buffer(slot, 1)));
      MEGATRAIN_RETURN_IF_ERROR(start(i, /*write=*/true));
    }
    return absl::OkStatus();
  };
  const absl::Status status = run();
  const absl::Status drained = ring_ != nullptr ? io.Drain() : absl::OkStatus();
  return status.ok() ? drained : status;
}

absl::Status NvmeMomentFiles::Read(MomentKind kind, int64_t offset, int64_t count, float* dst) {
  if (offset % kAlignElements != 0 || offset < 0 || count < 0 ||
      offset + AlignUp(count, kAlignElements) > numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe tier: read of [", offset, ", +", count, ") outside the moment files"));
  }
  float* bounce = static_cast<float*>(staging_.data());
  for (int64_t begin = 0; begin < count; begin += chunk_elements_) {
    const int64_t n = std::min(chunk_elements_, count - begin);
    MEGATRAIN_RETURN_IF_ERROR(
        SyncIo(false, kind, (offset + begin) * 4, AlignUp(n, kAlignElements) * 4, bounce));
    std::memcpy(dst + begin, bounce, n * 4);
  }
  return absl::OkStatus();
}

absl::Status NvmeMomentFiles::Write(MomentKind kind, int64_t offset, int64_t count,
                                    const float* src) {
  if (offset % kAlignElements != 0 || offset < 0 || count < 0 ||
      offset + AlignUp(count, kAlignElements) > numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe tier: write of [", offset, ", +", count, ") outside the moment files"));
  }
  float* bounce = static_cast<float*>(staging_.data());
  for (int64_t begin = 0; begin < count; begin += chunk_elements_) {
    const int64_t n = std::min(chunk_elements_, count - begin);
    const int64_t aligned = AlignUp(n, kAlignElements);
    std::memcpy(bounce, src + begin, n * 4);
    std::fill(bounce + n, bounce + aligned, 0.0f);  // block padding: zero, as in the store
    MEGATRAIN_RETURN_IF_ERROR(SyncIo(true, kind, (offset + begin) * 4, aligned * 4, bounce));
  }
  return absl::OkStatus();
}

NvmeShardLayout NvmeShardLayout::Create(const ModelLayout& layout, int rank, int world) {
  NvmeShardLayout out;
  out.rank = rank;
  out.world = world;
  int64_t offset = 0;
  for (const BlockLayout& block : layout.blocks) {
    // Note [Shard layout] in store/shard_layout.h: the optimizer's shard.
    const ShardRange shard = ShardOf(block.numel, rank, world);
    out.begin.push_back(shard.begin);
    out.end.push_back(shard.end);
    out.file_offset.push_back(offset);
    offset += AlignUp(shard.size(), kAlignElements);
  }
  out.numel = std::max(offset, kAlignElements);
  return out;
}

std::string NvmeShardFileSuffix(int global_rank, int global_world) {
  return global_world == 1 ? "" : absl::StrCat(".rank-", global_rank, "-of-", global_world);
}

int64_t NvmeTierFileBytes(const ModelLayout& layout, int world) {
  int64_t numel = 0;
  for (int rank = 0; rank < world; ++rank)
    numel += NvmeShardLayout::Create(layout, rank, world).numel;
  return 2 * 4 * numel;
}

absl::StatusOr<NvmeMomentTier> NvmeMomentTier::Create(std::vector<Shard> shards) {
  const int world = static_cast<int>(shards.size());
  if (world == 0) return absl::InvalidArgumentError("NVMe tier: no shards");
  for (int rank = 0; rank < world; ++rank) {
    const Shard& s = shards[static_cast<size_t>(rank)];
    if (s.files == nullptr || s.layout == nullptr || s.layout->rank != rank ||
        s.layout->world != world || s.files->numel() != s.layout->numel ||
        s.layout->begin.size() != shards[0].layout->begin.size()) {
      return absl::InvalidArgumentError(absl::StrCat("NVMe tier: shard ", rank, " of ", world,
                                                     " is missing or not rank ", rank, " of ",
                                                     world, "'s layout of the same model"));
    }
  }
  return NvmeMomentTier(std::move(shards));
}

std::vector<NvmeBlockPiece> NvmeMomentTier::Pieces(int64_t block) const {
  std::vector<NvmeBlockPiece> pieces;
  const size_t b = static_cast<size_t>(block);
  for (const Shard& s : shards_) {
    const int64_t count = s.layout->end[b] - s.layout->begin[b];
    if (count > 0) pieces.push_back({s.files, s.layout->file_offset[b], s.layout->begin[b], count});
  }
  return pieces;
}

}  // namespace megatrain::engine
