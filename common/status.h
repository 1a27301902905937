// Status and Result<T>: how every library in trainscope reports errors. Library code never
// exits or aborts on bad input; it returns a Status whose message tells the user what to fix.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ts {

enum class ErrorCode {
    Ok = 0,
    InvalidArgument,  // bad config / bad user input
    NotFound,         // missing file, run, key
    IoError,          // read/write/database failure
    Unsupported,      // feature not available on this backend/build
    NumericalError,   // NaN/inf loss, diverged
    CommError,        // collective failed / peer rank failed
    Timeout,          // deadlock guard, peer never arrived
    Cancelled,        // user asked to stop
    OutOfMemory,
    Internal,         // a bug in trainscope
};

const char* errorCodeName(ErrorCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(ErrorCode code, std::string message) : m_code(code), m_message(std::move(message)) {}

    static Status ok() { return {}; }
    static Status invalid(std::string m) { return {ErrorCode::InvalidArgument, std::move(m)}; }
    static Status notFound(std::string m) { return {ErrorCode::NotFound, std::move(m)}; }
    static Status io(std::string m) { return {ErrorCode::IoError, std::move(m)}; }
    static Status unsupported(std::string m) { return {ErrorCode::Unsupported, std::move(m)}; }
    static Status numerical(std::string m) { return {ErrorCode::NumericalError, std::move(m)}; }
    static Status comm(std::string m) { return {ErrorCode::CommError, std::move(m)}; }
    static Status timeout(std::string m) { return {ErrorCode::Timeout, std::move(m)}; }
    static Status cancelled(std::string m = "cancelled") { return {ErrorCode::Cancelled, std::move(m)}; }
    static Status internal(std::string m) { return {ErrorCode::Internal, std::move(m)}; }

    bool isOk() const { return m_code == ErrorCode::Ok; }
    explicit operator bool() const { return isOk(); }
    ErrorCode code() const { return m_code; }
    const std::string& message() const { return m_message; }
    // "InvalidArgument: tensor_model_parallel_size=3 does not divide num_attention_heads=8"
    std::string toString() const;
    // Prefixes context: Status::io("x").withContext("loading ckpt") -> "loading ckpt: x".
    Status withContext(const std::string& context) const;

private:
    ErrorCode m_code = ErrorCode::Ok;
    std::string m_message;
};

// Result<T>: a value or a non-ok Status (an expected-like type; std::expected is C++23).
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : m_data(std::move(value)) {}  // NOLINT(implicit)
    Result(Status status) : m_data(std::move(status)) {  // NOLINT(implicit)
        assert(!std::get<Status>(m_data).isOk() && "Result built from an ok Status");
    }

    bool isOk() const { return std::holds_alternative<T>(m_data); }
    explicit operator bool() const { return isOk(); }
    const Status& status() const {
        static const Status okStatus;
        return isOk() ? okStatus : std::get<Status>(m_data);
    }
    T& value() & { assert(isOk()); return std::get<T>(m_data); }
    const T& value() const& { assert(isOk()); return std::get<T>(m_data); }
    T&& value() && { assert(isOk()); return std::get<T>(std::move(m_data)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

private:
    std::variant<T, Status> m_data;
};

}  // namespace ts

// Propagate a non-ok Status from an expression returning Status.
#define TS_RETURN_IF_ERROR(expr)                     \
    do {                                             \
        ::ts::Status ts_status_ = (expr);            \
        if (!ts_status_.isOk()) return ts_status_;   \
    } while (0)

#define TS_CONCAT_INNER_(a, b) a##b
#define TS_CONCAT_(a, b) TS_CONCAT_INNER_(a, b)
// TS_ASSIGN_OR_RETURN(auto x, makeX()); declares x from a Result or returns its Status.
#define TS_ASSIGN_OR_RETURN(decl, expr) TS_ASSIGN_OR_RETURN_IMPL_(TS_CONCAT_(ts_result_, __LINE__), decl, expr)
#define TS_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
    auto tmp = (expr);                              \
    if (!tmp.isOk()) return tmp.status();           \
    decl = std::move(tmp).value()
