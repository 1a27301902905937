// TraceWriter: synchronous trace::Recorder over a TraceStore (importers, tests, tools).
// Rows go straight into the store inside a transaction that is committed every batchRows rows,
// so a reader sees whole batches and an import of millions of events stays fast.
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

#include "profiler/store.h"

namespace ts::profiler {

struct TraceWriter::Impl {
    TraceStore& store;
    size_t batchRows;
    size_t rowsInBatch = 0;
    Status firstError;
    std::unordered_map<std::string, uint32_t> stringIds;
    uint32_t nextStringId = 1;
    std::map<std::tuple<int32_t, int32_t, int, int32_t, std::string>, uint32_t> trackIds;
    uint32_t nextTrackId = 1;
    uint64_t nextCorrelation = 1;
    std::map<std::string, int64_t> pendingStats;
    std::vector<trace::Slice> pendingSlices;  // written sorted at the batch commit

    Impl(TraceStore& s, size_t rows) : store(s), batchRows(rows ? rows : 1) {}

    void note(const Status& st) {
        if (!st.isOk() && firstError.isOk()) firstError = st;
    }
    void row() {
        if (rowsInBatch == 0) note(store.beginBatch());
        if (++rowsInBatch >= batchRows) commit();
    }
    void commit() {
        // putSlices orders the batch by (track, ts) itself.
        note(store.putSlices(pendingSlices.data(), pendingSlices.size()));
        pendingSlices.clear();
        note(store.commitBatch());
        rowsInBatch = 0;
    }
};

TraceWriter::TraceWriter(TraceStore& store, size_t batchRows) : m(std::make_unique<Impl>(store, batchRows)) {
    // Continue the id spaces of what the store already holds (importing into an existing run).
    if (auto strs = store.strings()) {
        for (size_t i = 1; i < strs->size(); ++i)
            if (!(*strs)[i].empty()) m->stringIds.emplace((*strs)[i], uint32_t(i));
        m->nextStringId = uint32_t(strs->size());
    } else {
        m->note(strs.status());
    }
    if (auto trs = store.tracks()) {
        for (auto& t : *trs) {
            m->trackIds[{t.rank, t.device, int(t.kind), t.streamIndex, t.name}] = t.id;
            m->nextTrackId = std::max(m->nextTrackId, t.id + 1);
        }
    } else {
        m->note(trs.status());
    }
    if (auto maxCorr = store.maxCorrelation()) m->nextCorrelation = *maxCorr + 1;
}

TraceWriter::~TraceWriter() { (void)flush(); }

uint32_t TraceWriter::intern(std::string_view text) {
    if (text.empty()) return 0;
    auto it = m->stringIds.find(std::string(text));
    if (it != m->stringIds.end()) return it->second;
    uint32_t id = m->nextStringId++;
    m->stringIds.emplace(std::string(text), id);
    m->row();
    m->note(m->store.putString(id, text));
    return id;
}

uint32_t TraceWriter::track(const trace::TrackDesc& d) {
    auto key = std::make_tuple(d.rank, d.device, int(d.kind), d.streamIndex, d.name);
    auto it = m->trackIds.find(key);
    if (it != m->trackIds.end()) return it->second;
    uint32_t id = m->nextTrackId++;
    m->trackIds.emplace(key, id);
    m->row();
    m->note(m->store.putTrack(id, d));
    return id;
}

void TraceWriter::slice(const trace::Slice& s) {
    if (s.durNs < 0 || s.track == 0) {
        stat(s.track == 0 ? "writer.slice_without_track" : "writer.negative_duration");
        return;
    }
    m->pendingSlices.push_back(s);
    m->row();
}

void TraceWriter::counter(const trace::Counter& c) {
    m->row();
    m->note(m->store.putCounter(c));
}

void TraceWriter::metadata(std::string_view key, std::string_view value) {
    m->row();
    m->note(m->store.setMetadata(std::string(key), std::string(value)));
}

uint64_t TraceWriter::nextCorrelation() { return m->nextCorrelation++; }

void TraceWriter::stat(const std::string& name, int64_t delta) { m->pendingStats[name] += delta; }

Status TraceWriter::flush() {
    if (!m->pendingStats.empty()) {
        if (m->rowsInBatch == 0) m->note(m->store.beginBatch());
        for (auto& [name, delta] : m->pendingStats) m->note(m->store.addStat(name, delta));
        m->pendingStats.clear();
        m->rowsInBatch = 1;
    }
    if (m->rowsInBatch > 0) m->commit();
    Status st = m->firstError;
    m->firstError = Status::ok();
    return st;
}

}  // namespace ts::profiler
