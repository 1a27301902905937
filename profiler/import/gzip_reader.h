// A std::streambuf over a file that may be gzip-compressed (zlib detects it; plain files are
// passed through), so the JSON importer can stream a .json.gz without inflating it to
// memory or disk first. A truncated or corrupt gzip ends the stream early; failed() and
// error() then say why, and the caller counts what it could not read.
#pragma once

#include <cstdint>
#include <memory>
#include <streambuf>
#include <string>
#include <vector>

#include "common/status.h"

struct gzFile_s;  // zlib's gzFile

namespace ts::profiler::import {

class GzipStreamBuf : public std::streambuf {
public:
    static Result<std::unique_ptr<GzipStreamBuf>> open(const std::string& path, size_t bufferBytes = 1 << 18);
    ~GzipStreamBuf() override;
    GzipStreamBuf(const GzipStreamBuf&) = delete;
    GzipStreamBuf& operator=(const GzipStreamBuf&) = delete;

    bool failed() const { return !m_error.empty(); }
    const std::string& error() const { return m_error; }  // "unexpected end of file" when truncated
    bool compressed() const { return m_compressed; }
    uint64_t bytesOut() const { return m_bytesOut; }  // decompressed bytes handed out so far

protected:
    int_type underflow() override;

private:
    GzipStreamBuf() = default;
    gzFile_s* m_gz = nullptr;
    std::vector<char> m_buffer;
    std::string m_error;
    bool m_compressed = false;
    bool m_eof = false;
    uint64_t m_bytesOut = 0;
};

}  // namespace ts::profiler::import
