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

// The pools of a device's live graphs (and the one being captured).
class GraphPools {
public:
    // A new pool for a capture starting now.
    std::shared_ptr<GraphPool> begin() {
        auto p = std::make_shared<GraphPool>();
        m_capturing = p;
        m_pools.push_back(p);
        return p;
    }
    // The capture ended (made a graph or not): later allocations do not come from its pool.
    void end(uint64_t nextSerial) {
        if (m_capturing) m_capturing->endSerial = nextSerial;
        m_capturing.reset();
    }
    GraphPool* capturing() const { return m_capturing.get(); }
    // A graph (or a capture) of the device is alive. The backends allow one at a time: a block
    // freed while two live would be kept by the newer only, and the older could see it handed out.
    bool anyLive() {
        prune();
        return !m_pools.empty();
    }
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
    // A buffer is freed (b.serial its number): true when a live graph keeps its block (then
    // counted as a ghost), false when it goes back to the device's cache. `fromPool`: the block
    // was handed out during a capture (already in that pool's blockBytes).
    bool keep(const PoolBlock& b, bool fromPool) {
        prune();
        // The newest pool the buffer was alive for. Older pools it was alive for get the block
        // when this one goes (release).
        for (auto it = m_pools.rbegin(); it != m_pools.rend(); ++it) {
            auto p = it->lock();
            if (!p || b.serial >= p->endSerial) continue;
            p->free[b.cls].push_back(b);
            if (!fromPool) p->blockBytes += int64_t(b.cls);
            return true;
        }
        return false;
    }
    // The graph owning `pool` is destroyed: its free blocks go to an older live pool that may
    // use them, else they are returned (the caller releases their ghosts and caches them).
    std::vector<PoolBlock> release(const std::shared_ptr<GraphPool>& pool) {
        if (m_capturing == pool) m_capturing.reset();
        std::vector<std::weak_ptr<GraphPool>> rest;
        for (auto& w : m_pools) {
            auto p = w.lock();
            if (p && p != pool) rest.push_back(w);
        }
        m_pools.swap(rest);
        std::vector<PoolBlock> out;
        for (auto& [cls, blocks] : pool->free)
            for (const PoolBlock& b : blocks)
                if (!keep(b, false)) out.push_back(b);
        pool->free.clear();
        return out;
    }

private:
    void prune() {
        std::vector<std::weak_ptr<GraphPool>> live;
        for (auto& w : m_pools)
            if (!w.expired()) live.push_back(w);
        m_pools.swap(live);
    }
    std::shared_ptr<GraphPool> m_capturing;
    std::vector<std::weak_ptr<GraphPool>> m_pools;
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
