// zlib-backed streambuf (see gzip_reader.h).
#include "profiler/import/gzip_reader.h"

#include <cerrno>
#include <cstring>

#include <zlib.h>

namespace ts::profiler::import {

Result<std::unique_ptr<GzipStreamBuf>> GzipStreamBuf::open(const std::string& path, size_t bufferBytes) {
    gzFile gz = gzopen(path.c_str(), "rb");
    if (!gz) return Status::notFound("cannot open '" + path + "': " + std::strerror(errno));
    std::unique_ptr<GzipStreamBuf> buf(new GzipStreamBuf());
    buf->m_gz = gz;
    gzbuffer(gz, 1 << 17);
    buf->m_buffer.resize(bufferBytes);
    // gzdirect() is only meaningful after the first read; peek one byte through underflow.
    if (buf->underflow() != traits_type::eof()) buf->m_compressed = gzdirect(gz) == 0;
    return buf;
}

GzipStreamBuf::~GzipStreamBuf() {
    if (m_gz) gzclose(m_gz);
}

GzipStreamBuf::int_type GzipStreamBuf::underflow() {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (m_eof) return traits_type::eof();
    int n = gzread(m_gz, m_buffer.data(), static_cast<unsigned>(m_buffer.size()));
    if (n <= 0) {
        m_eof = true;
        int code = Z_OK;
        const char* msg = gzerror(m_gz, &code);
        if (n < 0 || (code != Z_OK && code != Z_STREAM_END))
            m_error = msg && *msg ? msg : "decompression failed";
        return traits_type::eof();
    }
    m_bytesOut += static_cast<uint64_t>(n);
    setg(m_buffer.data(), m_buffer.data(), m_buffer.data() + n);
    return traits_type::to_int_type(*gptr());
}

}  // namespace ts::profiler::import
