// Status formatting.
#include "common/status.h"

namespace ts {

const char* errorCodeName(ErrorCode code) {
    switch (code) {
        case ErrorCode::Ok: return "Ok";
        case ErrorCode::InvalidArgument: return "InvalidArgument";
        case ErrorCode::NotFound: return "NotFound";
        case ErrorCode::IoError: return "IoError";
        case ErrorCode::Unsupported: return "Unsupported";
        case ErrorCode::NumericalError: return "NumericalError";
        case ErrorCode::CommError: return "CommError";
        case ErrorCode::Timeout: return "Timeout";
        case ErrorCode::Cancelled: return "Cancelled";
        case ErrorCode::OutOfMemory: return "OutOfMemory";
        case ErrorCode::Internal: return "Internal";
    }
    return "Unknown";
}

std::string Status::toString() const {
    if (isOk()) return "Ok";
    return std::string(errorCodeName(m_code)) + ": " + m_message;
}

Status Status::withContext(const std::string& context) const {
    if (isOk()) return *this;
    return Status(m_code, context + ": " + m_message);
}

}  // namespace ts
