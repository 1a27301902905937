// Training data: a token stream (the shipped corpus, a text file, a Megatron indexed dataset,
// or synthetic) cut into samples of seq_length+1 tokens and served in a seeded shuffled order.
// The position is a single sample counter, so checkpoint/resume is exact.
//
// Megatron indexed dataset (.bin/.idx, megatron/core/datasets/indexed_dataset.py):
//   .idx = "MMIDIDX\0\0" | u64 version (=1) | u8 dtype code | u64 sequence_count |
//          u64 document_count | i32 sequence_lengths[sequence_count] |
//          i64 sequence_pointers[sequence_count] (byte offsets into .bin) |
//          i64 document_indices[document_count]
//   .bin = the tokens of all sequences, back to back, in the dtype.
//   dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
// All integers little-endian. Documents are concatenated (as GPTDataset does) before cutting.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"

namespace ts::engine {

struct IndexedDataset {
    uint8_t dtypeCode = 0;
    std::vector<int32_t> sequenceLengths;
    std::vector<int64_t> sequencePointers;
    std::vector<int64_t> documentIndices;
    std::vector<int32_t> tokens;  // all sequences concatenated
};
// Reads PREFIX.idx and PREFIX.bin.
Result<IndexedDataset> readIndexedDataset(const std::string& prefix);
// Writes one (dtype code 4 = int32, or 8 = uint16); one document per sequence.
Status writeIndexedDataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& sequences,
                           uint8_t dtypeCode = 4);

// Path of the shipped corpus (resources/corpus/genesis_kjv.txt), searched relative to the
// source tree, the executable's share dir and the current directory.
std::string defaultCorpusPath();

class DataSource {
public:
    // From config: data_path "" (shipped corpus), "synthetic", a .txt file, or an indexed
    // dataset prefix (PREFIX.idx + PREFIX.bin). Checks that every token < vocab_size.
    static Result<std::unique_ptr<DataSource>> open(const Config& c);
    // From a token stream (tests).
    static Result<std::unique_ptr<DataSource>> fromTokens(std::vector<int32_t> tokens, int seq,
                                                          uint64_t seed, std::string description);

    // Sample `index` (global counter) into column `bIdx` of a sequence-first microbatch of
    // b columns: tokens[s*b + bIdx] = x[s], labels = x[s+1].
    void fillSample(int64_t index, Microbatch& mb, int bIdx, int b) const;
    // Microbatch made of samples first..first+b-1.
    std::shared_ptr<Microbatch> microbatch(int64_t firstSample, int b) const;

    int64_t samplesPerEpoch() const { return m_synthetic ? (int64_t(1) << 40) : m_numSamples; }
    const std::string& description() const { return m_description; }
    int seq() const { return m_seq; }

private:
    int64_t sampleStart(int64_t index) const;  // token offset of shuffled sample
    std::vector<int32_t> m_tokens;
    int m_seq = 0;
    int64_t m_numSamples = 0;
    uint64_t m_seed = 0;
    bool m_synthetic = false;
    int m_vocab = 0;
    std::string m_description;
    mutable int64_t m_cachedEpoch = -1;
    mutable std::vector<int64_t> m_perm;
};

}  // namespace ts::engine
