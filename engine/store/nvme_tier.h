// The NVMe tier: AdamW moments (exp_avg, exp_avg_sq) kept in files on a
// local SSD instead of host memory, read ahead in the optimizer's order and
// written behind it through staging buffers of a bounded size (page-locked
// on request, for device copies; the CPU optimizer does not need it).
//
// Note [NVMe tier]
// The optimizer touches each moment once per step: read, update, write.
// Keeping them on an SSD costs 8 bytes per parameter of reads and 8 of
// writes per step and saves 8 bytes per parameter of host memory (of the
// 18 a bf16 job keeps: docs/operations.md "Sizing host memory"). The files
// use the host store's layout (blocks at 4 KiB-aligned offsets, fp32), so
// every block and every chunk of kNvmeTierChunkElements starts on a 4 KiB
// boundary and O_DIRECT reads and writes need no bounce. The staging is
// kNvmeTierBuffers sets of one chunk per moment: while the optimizer
// updates chunk i, chunk i+1 is being read and chunk i-1 written
// (NvmeTierStagingBytes(), a constant independent of the model).
//
// Note [Tier shards]
// With N data-parallel ranks in one process (Notes [Shared host store] and
// [Sharded optimizer] in step/gradient_reducer.h) rank r's optimizer
// updates elements ShardOf(numel, r, N) of every host block (c10d's
// layout, Note [Shard layout] in store/shard_layout.h). Each rank then
// keeps the moments of its shards in a pair of files of its own
// (NvmeShardLayout): its shard of every block in block order, each shard
// at a 4 KiB-aligned offset. The files are named by the rank's global
// rank G of W (NvmeShardFileSuffix): exp_avg.rank-G-of-W.bin and
// exp_avg_sq.rank-G-of-W.bin. With P processes of N ranks each (torchrun;
// Note [Replica processes] in dist/data_parallel.h) every process keeps
// a replica of all the moments, as it keeps one of the weights, split
// over its own N ranks as above; its rank r is global rank G = p x N + r
// of W = P x N, so file rank-G-of-W holds shard r of N of every block.
// Invariants:
//   * no two ranks open the same file, so none touches another's bytes,
//     also when the processes of one host are given one directory (a
//     file of the store's layout shared by the ranks cannot work: c10d's
//     shard boundaries are not 4 KiB-aligned, and O_DIRECT reads and
//     writes whole 4 KiB pages, which neighbouring shards share);
//   * a rank's files are read and written only by that rank's optimizer
//     thread, through its own NvmeMomentFiles (ring and staging: host
//     memory NvmeTierStagingBytes() per rank, N x that per process);
//   * one device of one process is the case W = 1: the whole of every
//     block at the host store's offsets, in exp_avg.bin and
//     exp_avg_sq.bin, as before (one device in each of P processes: the
//     same layout, in files named rank-p-of-P);
//   * the shards of a block in one process, in rank order, are
//     contiguous and cover it (NvmeMomentTier::Pieces over its N ranks),
//     so a checkpoint reads the same bytes whatever N and P, and a
//     checkpoint of N ranks resumes on any M. As with the moments in host
//     memory, process 0 writes the checkpoint once, from its files, and
//     every process reads it into its own; the replicas' files then hold
//     the same moments (DataParallelTrainer::ReplicasAgree compares them).
// A process's files hold sum over its ranks of the shards rounded up to
// 1024 elements (NvmeTierFileBytes): at most (N - 1) x 4 KiB per block and
// moment more than one device's; P processes on one host hold P times that.
#ifndef MEGATRAIN_ENGINE_STORE_NVME_TIER_H_
#define MEGATRAIN_ENGINE_STORE_NVME_TIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/host_buffer.h"
#include "engine/spec/nvme_tier_mode.h"

namespace megatrain::engine {

// fp32 elements of one moment per chunk (16 MiB): large enough for the
// SSD's full sequential rate, small enough that the staging stays bounded.
inline constexpr int64_t kNvmeTierChunkElements = int64_t{1} << 22;
// Buffer sets in flight: one being read, one being updated, one being written.
inline constexpr int64_t kNvmeTierBuffers = 3;

// Pinned host bytes of the tier's staging: kNvmeTierBuffers x 2 moments x
// kNvmeTierChunkElements x 4 B = 96 MiB, whatever the model.
constexpr int64_t NvmeTierStagingBytes() {
  return kNvmeTierBuffers * 2 * kNvmeTierChunkElements * 4;
}

// Which moment file.
enum class MomentKind { kExpAvg = 0, kExpAvgSq = 1 };

// A run of fp32 elements of both moment files, `offset` elements from the
// start; `offset` a multiple of 1024 (4 KiB), as the host store's block
// offsets are.
struct MomentRange {
  int64_t offset = 0;
  int64_t count = 0;
};

// The two moment files of one job: <dir>/exp_avg.bin and
// <dir>/exp_avg_sq.bin, `numel` fp32 each (the host store's arena_numel:
// blocks at their store offsets). I/O goes through io_uring (liburing)
// where the kernel allows it, else pread/pwrite; with O_DIRECT where the
// file system takes it (not tmpfs), else through the page cache
// (direct() says which; the caller logs it).
//
// Ownership: owns the two file descriptors, the ring and the staging
// buffers; the files stay on disk after destruction (the job directory's
// owner removes them). Thread-safety: none; one pass at a time, from one
// thread (the optimizer's).
class NvmeMomentFiles {
 public:
  // Creates (or truncates and zero-extends) the two files under `dir`
  // (which must exist), `numel` elements each (sparse: no bytes written).
  // `pin_staging` page-locks the staging (for device copies; the CPU
  // optimizer does not need it). `chunk_elements` (a multiple of 1024;
  // tests use small ones to make many chunks) sizes the staging:
  // kNvmeTierBuffers x 2 x chunk_elements fp32. Errors: INVALID_ARGUMENT
  // for numel or chunk_elements <= 0 or not a multiple of 1024; NOT_FOUND / PERMISSION_DENIED /
  // RESOURCE_EXHAUSTED naming the file when it cannot be created or sized.
  // `display_dir` (when not empty) names the directory in path() and in
  // messages instead of `dir`: a job opens its files through a directory
  // descriptor (DirFd::IoPath, "/proc/self/fd/N") and names them by path.
  // `name_suffix` goes between the file's stem and ".bin" (a rank's files,
  // NvmeShardFileSuffix: Note [Tier shards]).
  static absl::StatusOr<std::unique_ptr<NvmeMomentFiles>> Create(
      const std::string& dir, int64_t numel, bool pin_staging,
      int64_t chunk_elements = kNvmeTierChunkElements, const std::string& display_dir = "",
      const std::string& name_suffix = "");
  ~NvmeMomentFiles();
  NvmeMomentFiles(const NvmeMomentFiles&) = delete;
  NvmeMomentFiles& operator=(const NvmeMomentFiles&) = delete;

  const std::string& path(MomentKind kind) const { return files_[static_cast<int>(kind)].path; }
  int64_t numel() const { return numel_; }
  bool direct() const { return direct_; }             // O_DIRECT in use
  bool io_uring() const { return ring_ != nullptr; }  // io_uring in use (else pread/pwrite)

  // Called once per chunk of a pass, in order, with the chunk's range and
  // its two moments ([range.count] fp32 each, in staging); may modify them.
  using ChunkFn =
      std::function<absl::Status(const MomentRange& range, float* exp_avg, float* exp_avg_sq)>;

  // One optimizer pass: splits `ranges` into chunks of at most
  // chunk_elements, reads chunk i+1 while `fn` runs on chunk i and
  // writes chunk i back behind it (Note [NVMe tier]); returns once every
  // write has completed. Errors: `fn`'s error (later chunks not run, the
  // ones before it written); DATA_LOSS naming the file and offset for a
  // short read (a truncated file) or a failed read; RESOURCE_EXHAUSTED
  // (ENOSPC, EDQUOT) or INTERNAL for a failed write, naming the file.
  // After an I/O error the files' contents are undefined: the job fails
  // and resumes from its last checkpoint, which does not use them.
  absl::Status ForEachChunk(const std::vector<MomentRange>& ranges, const ChunkFn& fn);

  // Synchronous copies of `count` elements at `offset` (multiples of 1024
  // but the count of the last block), for checkpoints and resume. Errors as
  // ForEachChunk.
  absl::Status Read(MomentKind kind, int64_t offset, int64_t count, float* dst);
  absl::Status Write(MomentKind kind, int64_t offset, int64_t count, const float* src);

  // Bytes written to / read from the two files since creation (SSD wear:
  // the job reports the writes per step).
  int64_t bytes_written() const { return bytes_written_.load(); }
  int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  struct File {
    std::string path;
    int fd = -1;
  };
  struct Ring;  // liburing's io_uring, kept out of this header
  NvmeMomentFiles() = default;

  absl::Status SyncIo(bool write, MomentKind kind, int64_t offset, int64_t bytes, void* buf);

  File files_[2];
  int64_t numel_ = 0;
  int64_t chunk_elements_ = kNvmeTierChunkElements;
  bool direct_ = false;
  Ring* ring_ = nullptr;
  HostBuffer staging_;  // kNvmeTierBuffers x 2 x chunk_elements_ fp32
  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> bytes_read_{0};
};

// Where one pair of moment files keeps which elements of every block
// (Note [Tier shards]): rank `rank` of `world`'s shard of each block.
struct NvmeShardLayout {
  int rank = 0;
  int world = 1;
  // Per block: the elements [begin, end) these files hold (its shard;
  // begin == end when the rank owns none of the block), and the offset,
  // in elements from the file's start, of element `begin`'s moment (a
  // multiple of 1024).
  std::vector<int64_t> begin;
  std::vector<int64_t> end;
  std::vector<int64_t> file_offset;
  // Elements of each file: the shards rounded up to 1024 elements each
  // (at least 1024). With world 1 the host store's arena_numel(), the
  // blocks at its block_offset()s.
  int64_t numel = 0;

  // Rank `rank` of `world`'s layout of `layout`'s blocks. Precondition:
  // 0 <= rank < world.
  static NvmeShardLayout Create(const ModelLayout& layout, int rank, int world);
};

// "" for one device, ".rank-G-of-W" for global rank G of W > 1 (every
// process's ranks): the suffix of the rank's file names
// (NvmeMomentFiles::Create; Note [Tier shards]).
std::string NvmeShardFileSuffix(int global_rank, int global_world);

// Bytes of every moment file of `world` ranks of one process on `layout`
// together (both moments, every rank: 8 x the sum of their
// NvmeShardLayout::numel). What one process's tier holds on disk;
// admission's MemoryFootprint::nvme_bytes.
int64_t NvmeTierFileBytes(const ModelLayout& layout, int world);

// Elements [begin, begin + count) of one block, kept in `files` from
// element `file_offset` on (a multiple of 1024).
struct NvmeBlockPiece {
  NvmeMomentFiles* files = nullptr;
  int64_t file_offset = 0;
  int64_t begin = 0;
  int64_t count = 0;
};

// The AdamW moments of one host store on the NVMe tier, addressed by
// block: the moment files of every optimizer shard (Note [Tier shards]).
// Holds pointers only: the trainers own the files and the layouts, which
// must outlive it. Thread-safety: as NvmeMomentFiles; use it only while
// no optimizer runs (between WaitForOptimizer and the next step), for
// checkpoints and resume.
class NvmeMomentTier {
 public:
  struct Shard {
    NvmeMomentFiles* files = nullptr;
    const NvmeShardLayout* layout = nullptr;
  };
  // INVALID_ARGUMENT unless `shards` are ranks 0..N-1 of N, in order, each
  // with files of its layout's numel and layouts of one block count.
  static absl::StatusOr<NvmeMomentTier> Create(std::vector<Shard> shards);

  // The pieces of `block`, in element order: contiguous, covering
  // [0, block numel) (ranks owning none of it left out).
  std::vector<NvmeBlockPiece> Pieces(int64_t block) const;
  int64_t num_blocks() const { return static_cast<int64_t>(shards_[0].layout->begin.size()); }
  int world() const { return static_cast<int>(shards_.size()); }

 private:
  explicit NvmeMomentTier(std::vector<Shard> shards) : shards_(std::move(shards)) {}
  std::vector<Shard> shards_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STORE_NVME_TIER_H_
