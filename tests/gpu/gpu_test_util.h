// Shared by the gpu-labelled tests: assert that a ts::Status is ok, printing the expression
// and the status message otherwise.
#pragma once

#include <gtest/gtest.h>

#include "common/status.h"

#define TS_ASSERT_OK(expr)                                        \
    do {                                                          \
        const ::ts::Status s_ = (expr);                           \
        ASSERT_TRUE(s_.isOk()) << #expr << ": " << s_.toString(); \
    } while (0)
