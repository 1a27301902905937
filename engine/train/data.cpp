// Data sources: shipped corpus, text files, Megatron indexed datasets, synthetic tokens.
#include "engine/train/data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/model/layers.h"
#include "engine/train/tokenizer.h"

#ifndef TS_SOURCE_DIR
#define TS_SOURCE_DIR "."
#endif

namespace ts::engine {

namespace fs = std::filesystem;

namespace {

constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

int dtypeBytes(uint8_t code) {
    switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: return 4;
    case 5: return 8;
    default: return 0;  // float types are not token data
    }
}

template <typename T> bool readPod(std::istream& in, T& v) {
    return bool(in.read(reinterpret_cast<char*>(&v), sizeof(T)));
}
template <typename T> void writePod(std::ostream& out, const T& v) {
    out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

Result<IndexedDataset> readIndexedDataset(const std::string& prefix) {
    const std::string idx = prefix + ".idx", bin = prefix + ".bin";
    std::ifstream in(idx, std::ios::binary);
    if (!in) return Status::notFound("indexed dataset index '" + idx + "' not found (data_path is the prefix without .idx/.bin)");
    char magic[9];
    if (!in.read(magic, 9) || std::memcmp(magic, kIdxMagic, 9) != 0)
        return Status::invalid("'" + idx + "' is not a Megatron indexed dataset index (bad MMIDIDX header)");
    uint64_t version = 0, nseq = 0, ndoc = 0;
    IndexedDataset ds;
    if (!readPod(in, version) || !readPod(in, ds.dtypeCode) || !readPod(in, nseq) || !readPod(in, ndoc))
        return Status::invalid("'" + idx + "' is truncated (header)");
    if (version != 1) return Status::unsupported("'" + idx + "': index version " + std::to_string(version) + " (only 1 is supported)");
    const int es = dtypeBytes(ds.dtypeCode);
    if (es == 0)
        return Status::unsupported("'" + idx + "': dtype code " + std::to_string(ds.dtypeCode) +
                                   " is not an integer token type");
    const std::streamoff idxSize = std::streamoff(fs::file_size(idx));
    const uint64_t need = 9 + 8 + 1 + 8 + 8 + nseq * 12 + ndoc * 8;
    if (nseq > (uint64_t(1) << 40) || ndoc > (uint64_t(1) << 40) || need > uint64_t(idxSize))
        return Status::invalid("'" + idx + "' is truncated: header says " + std::to_string(nseq) + " sequences, " +
                               std::to_string(ndoc) + " documents");
    ds.sequenceLengths.resize(nseq);
    ds.sequencePointers.resize(nseq);
    ds.documentIndices.resize(ndoc);
    in.read(reinterpret_cast<char*>(ds.sequenceLengths.data()), std::streamsize(nseq * 4));
    in.read(reinterpret_cast<char*>(ds.sequencePointers.data()), std::streamsize(nseq * 8));
    in.read(reinterpret_cast<char*>(ds.documentIndices.data()), std::streamsize(ndoc * 8));
    if (!in) return Status::invalid("'" + idx + "' is truncated (arrays)");

    std::ifstream bf(bin, std::ios::binary);
    if (!bf) return Status::notFound("indexed dataset data '" + bin + "' not found");
    const uint64_t binSize = fs::file_size(bin);
    std::vector<char> raw;
    for (uint64_t i = 0; i < nseq; ++i) {
        const int64_t len = ds.sequenceLengths[i], ptr = ds.sequencePointers[i];
        if (len < 0 || ptr < 0 || uint64_t(ptr) + uint64_t(len) * uint64_t(es) > binSize)
            return Status::invalid("'" + bin + "': sequence " + std::to_string(i) + " points past the end of the file");
        raw.resize(size_t(len) * size_t(es));
        bf.seekg(ptr);
        if (!bf.read(raw.data(), std::streamsize(raw.size())))
            return Status::io("reading '" + bin + "' failed");
        for (int64_t j = 0; j < len; ++j) {
            const char* p = raw.data() + j * es;
            int64_t v = 0;
            switch (ds.dtypeCode) {
            case 1: v = *reinterpret_cast<const uint8_t*>(p); break;
            case 2: v = *reinterpret_cast<const int8_t*>(p); break;
            case 3: { int16_t x; std::memcpy(&x, p, 2); v = x; break; }
            case 8: { uint16_t x; std::memcpy(&x, p, 2); v = x; break; }
            case 4: { int32_t x; std::memcpy(&x, p, 4); v = x; break; }
            case 5: { int64_t x; std::memcpy(&x, p, 8); v = x; break; }
            default: break;
            }
            if (v < 0 || v > INT32_MAX)
                return Status::invalid("'" + bin + "': token " + std::to_string(v) + " out of range");
            ds.tokens.push_back(int32_t(v));
        }
    }
    return ds;
}

Status writeIndexedDataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& seqs,
                           uint8_t dtypeCode) {
    if (dtypeCode != 4 && dtypeCode != 8) return Status::invalid("writer supports dtype codes 4 (int32) and 8 (uint16)");
    const int es = dtypeBytes(dtypeCode);
    std::ofstream bin(prefix + ".bin", std::ios::binary);
    std::ofstream idx(prefix + ".idx", std::ios::binary);
    if (!bin || !idx) return Status::io("cannot write indexed dataset '" + prefix + "'");
    std::vector<int32_t> lengths;
    std::vector<int64_t> pointers;
    int64_t off = 0;
    for (const auto& s : seqs) {
        lengths.push_back(int32_t(s.size()));
        pointers.push_back(off);
        for (int32_t t : s) {
            if (dtypeCode == 8) {
                if (t < 0 || t > 65535) return Status::invalid("token " + std::to_string(t) + " does not fit uint16");
                writePod(bin, uint16_t(t));
            } else {
                writePod(bin, t);
            }
        }
        off += int64_t(s.size()) * es;
    }
    idx.write(kIdxMagic, 9);
    writePod(idx, uint64_t(1));
    writePod(idx, dtypeCode);
    writePod(idx, uint64_t(seqs.size()));
    writePod(idx, uint64_t(seqs.size() + 1));  // document_indices: 0..n (one doc per sequence)
    idx.write(reinterpret_cast<const char*>(lengths.data()), std::streamsize(lengths.size() * 4));
    idx.write(reinterpret_cast<const char*>(pointers.data()), std::streamsize(pointers.size() * 8));
    for (uint64_t i = 0; i <= seqs.size(); ++i) writePod(idx, int64_t(i));
    if (!bin || !idx) return Status::io("writing indexed dataset '" + prefix + "' failed");
    return Status::ok();
}

std::string defaultCorpusPath() {
    const char* rel = "resources/corpus/genesis_kjv.txt";
    for (const char* base : {TS_SOURCE_DIR, ".", ".."}) {
        fs::path p = fs::path(base) / rel;
        std::error_code ec;
        if (fs::exists(p, ec)) return p.string();
    }
    return (fs::path(TS_SOURCE_DIR) / rel).string();
}

Result<std::unique_ptr<DataSource>> DataSource::fromTokens(std::vector<int32_t> tokens, int seq, uint64_t seed,
                                                           std::string description) {
    if (seq <= 0) return Status::invalid("seq_length must be > 0");
    if (int64_t(tokens.size()) < int64_t(seq) + 1)
        return Status::invalid(description + " has " + std::to_string(tokens.size()) +
                               " tokens, fewer than one sample of seq_length+1=" + std::to_string(seq + 1));
    std::unique_ptr<DataSource> d(new DataSource());
    d->m_tokens = std::move(tokens);
    d->m_seq = seq;
    d->m_seed = seed;
    d->m_numSamples = (int64_t(d->m_tokens.size()) - 1) / seq;
    d->m_description = std::move(description);
    return d;
}

Result<std::unique_ptr<DataSource>> DataSource::open(const Config& c) {
    const uint64_t seed = uint64_t(int64_t(c.seed));
    if (c.data_path == "synthetic") {
        std::unique_ptr<DataSource> d(new DataSource());
        d->m_synthetic = true;
        d->m_seq = c.seq_length;
        d->m_seed = seed;
        d->m_vocab = c.vocab_size;
        d->m_description = "synthetic arithmetic sequences (vocab " + std::to_string(c.vocab_size) + ")";
        return d;
    }
    std::vector<int32_t> tokens;
    std::string desc;
    const std::string path = c.data_path.empty() ? defaultCorpusPath() : c.data_path;
    std::error_code ec;
    const bool isText = c.data_path.empty() || fs::path(path).extension() == ".txt";
    if (isText) {
        if (!fs::exists(path, ec)) return Status::notFound("data file '" + path + "' not found");
        if (c.tokenizer_type != "byte")
            return Status::unsupported("tokenizer_type=" + c.tokenizer_type + " is not implemented; use byte");
        std::ifstream in(path, std::ios::binary);
        if (!in) return Status::io("cannot read data file '" + path + "'");
        std::stringstream ss;
        ss << in.rdbuf();
        tokens = ByteTokenizer().encode(ss.str());
        desc = "text '" + path + "' (" + std::to_string(tokens.size()) + " byte tokens)";
        if (c.vocab_size < ByteTokenizer::kVocab)
            return Status::invalid("byte-level text needs vocab_size >= 256 (got " + std::to_string(c.vocab_size) + ")");
    } else {
        TS_ASSIGN_OR_RETURN(IndexedDataset ds, readIndexedDataset(path));
        tokens = std::move(ds.tokens);
        desc = "indexed dataset '" + path + "' (" + std::to_string(tokens.size()) + " tokens)";
    }
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] >= c.vocab_size)
            return Status::invalid(desc + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                                   " is >= vocab_size=" + std::to_string(c.vocab_size));
    return fromTokens(std::move(tokens), c.seq_length, seed, desc);
}

int64_t DataSource::sampleStart(int64_t index) const {
    const int64_t epoch = index / m_numSamples, within = index % m_numSamples;
    if (epoch != m_cachedEpoch) {
        // Fisher-Yates with a counter-based generator keyed by (seed, epoch).
        m_perm.resize(size_t(m_numSamples));
        for (int64_t i = 0; i < m_numSamples; ++i) m_perm[size_t(i)] = i;
        const uint64_t key = hashCombine(m_seed, uint64_t(epoch) + 0x1234);
        for (int64_t i = m_numSamples - 1; i > 0; --i) {
            const int64_t j = int64_t(splitmix64(key + uint64_t(i)) % uint64_t(i + 1));
            std::swap(m_perm[size_t(i)], m_perm[size_t(j)]);
        }
        m_cachedEpoch = epoch;
    }
    return m_perm[size_t(within)] * m_seq;
}

void DataSource::fillSample(int64_t index, Microbatch& mb, int bIdx, int b) const {
    const int s = m_seq;
    if (m_synthetic) {
        // x[i] = (start + i*stride) mod V: learnable (the model must infer the stride).
        const uint64_t h = hashCombine(m_seed, uint64_t(index));
        const int64_t V = std::max(2, m_vocab);
        const int64_t start = int64_t(h % uint64_t(V));
        const int64_t stride = 1 + int64_t((h >> 32) % 7);
        for (int i = 0; i < s; ++i) {
            mb.tokens[size_t(i) * b + bIdx] = int32_t((start + i * stride) % V);
            mb.labels[size_t(i) * b + bIdx] = int32_t((start + (i + 1) * stride) % V);
        }
        return;
    }
    const int64_t off = sampleStart(index);
    for (int i = 0; i < s; ++i) {
        mb.tokens[size_t(i) * b + bIdx] = m_tokens[size_t(off + i)];
        mb.labels[size_t(i) * b + bIdx] = m_tokens[size_t(off + i + 1)];
    }
}

std::shared_ptr<Microbatch> DataSource::microbatch(int64_t firstSample, int b) const {
    auto mb = std::make_shared<Microbatch>();
    mb->tokens.resize(size_t(m_seq) * b);
    mb->labels.resize(size_t(m_seq) * b);
    for (int j = 0; j < b; ++j) fillSample(firstSample + j, *mb, j, b);
    return mb;
}

}  // namespace ts::engine
