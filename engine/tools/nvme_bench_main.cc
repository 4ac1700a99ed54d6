// megatrain-nvme-bench: the NVMe tier's rates on this machine's disk, for
// `megatrain plan --nvme_read_gbps --nvme_write_gbps` and for checking the
// tier on a GPU host's local SSD. Creates the two moment files
// (engine/store/nvme_tier.h) under --dir, fills them, then times optimizer
// passes (read ahead, touch every element, write behind) over all of them.
// Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "engine/store/nvme_tier.h"
#include "nlohmann/json.hpp"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  using megatrain::engine::MomentRange;
  using megatrain::engine::NvmeMomentFiles;
  std::string dir;
  double gib = 4;
  int passes = 2;
  CLI::App app{"megatrain-nvme-bench: NVMe tier pass rates on a directory's disk"};
  app.set_version_flag("--version", std::string("megatrain-nvme-bench ") + MEGATRAIN_VERSION);
  app.add_option("--dir", dir, "Directory on the SSD (the daemon's --nvme_dir)")->required();
  app.add_option("--gib", gib, "Size of each moment file, GiB")->capture_default_str();
  app.add_option("--passes", passes, "Timed passes")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (gib <= 0 || gib > 4096 || passes < 1 || passes > 100) {
    std::fprintf(stderr, "megatrain-nvme-bench: --gib in (0, 4096], --passes in [1, 100]\n");
    return 2;
  }
  const int64_t numel = static_cast<int64_t>(gib * (1 << 30) / 4) / 1024 * 1024;
  auto files = NvmeMomentFiles::Create(dir, numel, /*pin_staging=*/false);
  if (!files.ok()) {
    std::fprintf(stderr, "megatrain-nvme-bench: %s\n", files.status().ToString().c_str());
    return 1;
  }
  const std::vector<MomentRange> all = {{0, numel}};
  // The first pass writes every byte (the files start sparse); then time.
  auto touch = [](const MomentRange& r, float* m, float* v) {
    for (int64_t i = 0; i < r.count; i += 1024) m[i] += 1, v[i] += 1;
    return absl::OkStatus();
  };
  absl::Status status = (*files)->ForEachChunk(all, touch);
  const int64_t read0 = (*files)->bytes_read(), written0 = (*files)->bytes_written();
  const auto start = std::chrono::steady_clock::now();
  for (int p = 0; p < passes && status.ok(); ++p) status = (*files)->ForEachChunk(all, touch);
  const double seconds = Seconds(start);
  if (!status.ok()) {
    std::fprintf(stderr, "megatrain-nvme-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  const double read = static_cast<double>((*files)->bytes_read() - read0);
  const double written = static_cast<double>((*files)->bytes_written() - written0);
  nlohmann::json out = {{"dir", dir},
                        {"io_uring", (*files)->io_uring()},
                        {"o_direct", (*files)->direct()},
                        {"bytes_per_pass", read / passes},
                        {"pass_seconds", seconds / passes},
                        // A pass reads and writes the same bytes, overlapped.
                        {"read_gb_per_s", read / seconds / 1e9},
                        {"write_gb_per_s", written / seconds / 1e9}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
