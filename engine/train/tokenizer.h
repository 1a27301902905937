// Tokenizers for the shipped corpus: byte-level (vocab 256, id = byte value).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ts::engine {

class ByteTokenizer {
public:
    static constexpr int kVocab = 256;
    std::vector<int32_t> encode(const std::string& text) const;
    std::string decode(const std::vector<int32_t>& ids) const;  // ids outside [0,256) -> '?'
};

}  // namespace ts::engine
