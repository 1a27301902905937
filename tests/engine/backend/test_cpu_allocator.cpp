// The CPU backend's caching allocator: freed blocks are reused, accounting stays the exact live
// bytes asked for (the cache is reported apart), allocate() still zeroes a reused block, the
// memory limit counts live bytes only.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/backend/backend.h"

namespace ts::engine {
namespace {

TEST(CpuAllocator, ReusesFreedBlocksWithExactAccounting) {
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    void* first = nullptr;
    {
        auto a = d.allocateUninitialized(100000, MemCategory::Activations);
        ASSERT_TRUE(a.isOk());
        first = (*a)->data();
        std::memset(first, 0xAB, 100000);  // garbage a later zeroing allocate must clear
        EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Activations)], 100000);
        EXPECT_EQ(d.memoryStats().cached, 0);
    }
    MemoryStats st = d.memoryStats();
    EXPECT_EQ(st.currentTotal, 0);
    EXPECT_GE(st.cached, 100000);  // kept for reuse, not counted as in use
    // A slightly different size of the same size class gets the same block, zeroed.
    auto b = d.allocate(99000, MemCategory::Workspace);
    ASSERT_TRUE(b.isOk());
    EXPECT_EQ((*b)->data(), first);
    const auto* bytes = (*b)->as<uint8_t>();
    for (size_t i = 0; i < 99000; ++i) ASSERT_EQ(bytes[i], 0) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*b)->data()) % 64, 0u);
    st = d.memoryStats();
    EXPECT_EQ(st.current[size_t(MemCategory::Workspace)], 99000);
    EXPECT_EQ(st.current[size_t(MemCategory::Activations)], 0);
    EXPECT_EQ(st.peak[size_t(MemCategory::Activations)], 100000);
    EXPECT_EQ(st.cached, 0);
}

TEST(CpuAllocator, DifferentSizeClassesDoNotShareBlocksAndLimitCountsLiveBytes) {
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    d.setMemoryLimit(1 << 20);
    {
        auto a = d.allocate(600000, MemCategory::Params);
        ASSERT_TRUE(a.isOk());
    }
    // The 600000-byte block is cached, but the limit is about live bytes: this fits.
    auto big = d.allocate(900000, MemCategory::Activations);
    ASSERT_TRUE(big.isOk()) << big.status().toString();
    auto small = d.allocate(1000, MemCategory::Activations);
    ASSERT_TRUE(small.isOk());
    EXPECT_NE((*small)->data(), (*big)->data());
    EXPECT_EQ(d.memoryStats().currentTotal, 901000);
    auto tooMuch = d.allocate(200000, MemCategory::Activations);
    EXPECT_FALSE(tooMuch.isOk());
    EXPECT_EQ(tooMuch.status().code(), ErrorCode::OutOfMemory);
}

// Blocks of 2 MiB and more are mapped 2 MiB aligned (huge-page candidates). They go through
// the same cache and accounting as small blocks, and allocate() zeroes them when reused.
TEST(CpuAllocator, LargeBlocksAreHugePageAlignedCachedAndZeroed) {
    auto be = makeCpuBackend(1);
    Device& d = be->device(0);
    const size_t big = (size_t(5) << 20) + 12345;  // not a multiple of the page size
    void* first = nullptr;
    {
        auto a = d.allocateUninitialized(big, MemCategory::Activations);
        ASSERT_TRUE(a.isOk()) << a.status().toString();
        first = (*a)->data();
        EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (size_t(2) << 20), 0u);
        std::memset(first, 0x5A, big);  // every byte is usable
        EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Activations)], int64_t(big));
    }
    EXPECT_EQ(d.memoryStats().currentTotal, 0);
    EXPECT_GE(d.memoryStats().cached, int64_t(big));
    auto b = d.allocate(big - 100, MemCategory::Grads);
    ASSERT_TRUE(b.isOk());
    EXPECT_EQ((*b)->data(), first);
    const auto* bytes = (*b)->as<uint8_t>();
    for (size_t i = 0; i < big - 100; i += 4093) ASSERT_EQ(bytes[i], 0) << i;
    ASSERT_EQ(bytes[big - 101], 0);
    EXPECT_EQ(d.memoryStats().current[size_t(MemCategory::Grads)], int64_t(big - 100));
    // A block of another size class is a different mapping, also aligned.
    auto c = d.allocate(size_t(3) << 20, MemCategory::Params);
    ASSERT_TRUE(c.isOk());
    EXPECT_NE((*c)->data(), first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*c)->data()) % (size_t(2) << 20), 0u);
}

}  // namespace
}  // namespace ts::engine
