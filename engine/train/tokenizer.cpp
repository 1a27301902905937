// Byte-level tokenizer.
#include "engine/train/tokenizer.h"

namespace ts::engine {

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(int32_t(c));
    return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) s.push_back(id >= 0 && id < kVocab ? char(id) : '?');
    return s;
}

}  // namespace ts::engine
