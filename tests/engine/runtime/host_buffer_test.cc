// Tests for engine/runtime/host_buffer.h (FaultIn: every page resident,
// contents kept) and Note [Prefaulted moments] in store/host_store.cc (the
// AdamW moments are resident after HostStore::Create).
#include "engine/runtime/host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/store/host_store.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

// Pages of [data, data + bytes) that mincore(2) reports resident, and the
// pages in all.
struct Residency {
  size_t resident = 0;
  size_t pages = 0;
};

Residency ResidentPages(const void* data, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  Residency r;
  r.pages = (end - begin) / page;
  std::vector<unsigned char> vec(r.pages);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return r;
  for (unsigned char v : vec) r.resident += v & 1;
  return r;
}

TEST(HostBufferTest, FaultInMakesEveryPageResident) {
  const size_t bytes = 64 << 20;  // 64 MiB: many pages on every thread
  absl::StatusOr<HostBuffer> buffer = HostBuffer::Allocate(bytes, /*pin=*/false);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const Residency before = ResidentPages(buffer->data(), bytes);
  ASSERT_GT(before.pages, 0u);
  EXPECT_LT(before.resident, before.pages) << "a fresh anonymous mapping is not all resident";
  buffer->FaultIn();
  const Residency after = ResidentPages(buffer->data(), bytes);
  EXPECT_EQ(after.resident, after.pages);
}

TEST(HostBufferTest, FaultInKeepsContents) {
  const size_t bytes = (8 << 20) + 123;  // not a whole number of pages
  absl::StatusOr<HostBuffer> buffer = HostBuffer::Allocate(bytes, /*pin=*/false);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto* p = static_cast<unsigned char*>(buffer->data());
  for (size_t i = 0; i < bytes; i += 4093) p[i] = static_cast<unsigned char>(1 + i % 251);
  buffer->FaultIn();
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char want = i % 4093 == 0 ? static_cast<unsigned char>(1 + i % 251) : 0;
    ASSERT_EQ(p[i], want) << "byte " << i;
  }
}

TEST(HostBufferTest, FaultInOfAnEmptyBufferDoesNothing) {
  absl::StatusOr<HostBuffer> buffer = HostBuffer::Allocate(0, /*pin=*/false);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  buffer->FaultIn();
  EXPECT_EQ(buffer->data(), nullptr);
  HostBuffer moved_from;
  moved_from.FaultIn();
  EXPECT_EQ(moved_from.bytes(), 0u);
}

TEST(HostStorePrefaultTest, MomentsAreResidentAfterCreate) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<HostStore>> store = HostStore::Create(*config, HostStoreOptions{});
  ASSERT_TRUE(store.ok()) << store.status();
  const HostStore& s = **store;
  for (int64_t block = 0; block < static_cast<int64_t>(s.layout().blocks.size()); ++block) {
    const size_t bytes = static_cast<size_t>(s.block_numel(block)) * 4;
    for (const float* arena : {s.exp_avg(block), s.exp_avg_sq(block)}) {
      ASSERT_NE(arena, nullptr);
      const Residency r = ResidentPages(arena, bytes);
      EXPECT_EQ(r.resident, r.pages) << "block " << block;
      EXPECT_EQ(arena[0], 0.0f);
      EXPECT_EQ(arena[s.block_numel(block) - 1], 0.0f);
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
