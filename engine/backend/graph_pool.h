// Internal to engine/backend: the memory of stream graphs (graph.h), shared by the emulated
// device and the CUDA backend. A device numbers its allocations (serials); a graph's pool holds
// the blocks of every buffer that was alive while the graph was captured (allocated before the
// capture ended) and was freed while the graph lives, so no other buffer gets an address the
// graph's kernels use. While the capture runs, allocations take the pool's free blocks first.
// The pool's free blocks stay counted in the category of the buffer that freed them (ghosts)
// until they are handed out again during the capture or the graph is destroyed.
// Every member is guarded by the device's accounting mutex (MemAccounting::mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/recorder.h"
#include "engine/backend/host_runtime.h"

namespace ts::engine::host {

struct PoolBlock {
    uintptr_t addr = 0;  // the backend's block handle (device pointer, arena offset)
    uint64_t serial = 0; // of the buffer that freed it
    size_t cls = 0;      // size class
    size_t bytes = 0;    // the ghost: bytes still counted, and their category
    trace::MemCategory cat = trace::MemCategory::Workspace;
};

struct GraphPool {
    // Buffers numbered below this may be used by the graph (UINT64_MAX while capturing).
    uint64_t endSerial = std::numeric_limits<uint64_t>::max();
    std::unordered_map<size_t, std::vector<PoolBlock>> free;  // class -> blocks
    int64_t blockBytes = 0;  // every block the pool took (live or free), by class size
};

// The pool of a device's live graph (or of the capture running). One at a time: the backends
// refuse a capture while a graph lives (anyLive), since a block freed while two lived could be
// kept for one and handed out while the other still uses it.
class GraphPools {
public:
    // A new pool for a capture starting now.
    std::shared_ptr<GraphPool> begin() {
        auto p = std::make_shared<GraphPool>();
        m_capturing = p;
        m_live = p;
        return p;
    }
    // The capture ended (made a graph or not): later allocations do not come from its pool.
    void end(uint64_t nextSerial) {
        if (m_capturing) m_capturing->endSerial = nextSerial;
        m_capturing.reset();
    }
    GraphPool* capturing() const { return m_capturing.get(); }
    // A graph (or a capture) of the device is alive.
    bool anyLive() const { return !m_live.expired(); }
    // A free block of class `cls` from the capturing pool (its ghost is the caller's to release),
    // or false.
    bool take(size_t cls, PoolBlock* out) {
        if (!m_capturing) return false;
        auto it = m_capturing->free.find(cls);
        if (it == m_capturing->free.end() || it->second.empty()) return false;
        *out = it->second.back();
        it->second.pop_back();
        return true;
    }
    // A block handed out during the capture now belongs to the capturing pool.
    void adoptNew(size_t cls) {
        if (m_capturing) m_capturing->blockBytes += int64_t(cls);
    }
    // A buffer is freed (b.serial its number): true when the live graph may use its block (the
    // buffer was alive during the capture), which it then keeps, counted as a ghost; false when
    // the block goes back to the device's cache. `fromPool`: handed out during the capture
    // (already in the pool's blockBytes).
    bool keep(const PoolBlock& b, bool fromPool) {
        auto p = m_live.lock();
        if (!p || b.serial >= p->endSerial) return false;
        p->free[b.cls].push_back(b);
        if (!fromPool) p->blockBytes += int64_t(b.cls);
        return true;
    }
    // The graph owning `pool` is destroyed: its free blocks, returned (the caller releases their
    // ghosts and caches them).
    std::vector<PoolBlock> release(const std::shared_ptr<GraphPool>& pool) {
        if (m_capturing == pool) m_capturing.reset();
        if (m_live.lock() == pool) m_live.reset();
        std::vector<PoolBlock> out;
        for (auto& [cls, blocks] : pool->free) out.insert(out.end(), blocks.begin(), blocks.end());
        pool->free.clear();
        return out;
    }

private:
    std::shared_ptr<GraphPool> m_capturing;
    std::weak_ptr<GraphPool> m_live;
};

// The memory state of a device that has graphs (the emulated device's, the CUDA backend's): the
// accounting, the allocation serials, the pools and the thread capturing now (its allocations
// are the capture's). Every member is guarded by `mutex`.
struct GraphMemAccounting : MemAccounting {
    uint64_t nextSerial = 0;
    GraphPools graphs;
    std::thread::id captureThread;  // default (none) when no capture runs

    // Whether this thread's allocations go to a capture now.
    bool capturingThreadLocked() const {
        return graphs.capturing() && captureThread == std::this_thread::get_id();
    }
    // Accounts a new buffer of `bytes` (size class cls) in `cat` and numbers it (*serial). For the
    // capturing thread a free block of the capture's pool is taken when there is one: *pooled
    // true, *addr its handle, the ghost it carried released. OutOfMemory past the limit leaves
    // everything as it was.
    Status reserveNewLocked(size_t bytes, size_t cls, trace::MemCategory cat, int64_t* current, uint64_t* serial,
                            bool* pooled, uintptr_t* addr) {
        PoolBlock b;
        *pooled = capturingThreadLocked() && graphs.take(cls, &b);
        if (*pooled) reportCounter(b.cat, releaseLocked(b.bytes, b.cat));
        if (Status r = reserveLocked(bytes, cat, current); !r) {
            if (*pooled) {  // back into the pool, counted as before
                int64_t ghost = 0;
                (void)reserveLocked(b.bytes, b.cat, &ghost);
                graphs.keep(b, true);
                *pooled = false;
            }
            return r;
        }
        *serial = nextSerial++;
        *addr = b.addr;
        return Status::ok();
    }
};

}  // namespace ts::engine::host
