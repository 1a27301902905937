// Status / Result behaviour.
#include <gtest/gtest.h>

#include "common/status.h"

namespace ts {
namespace {

Result<int> parsePositive(int x) {
    if (x <= 0) return Status::invalid("x=" + std::to_string(x) + " must be positive");
    return x;
}

Status useTwice(int x, int* out) {
    TS_ASSIGN_OR_RETURN(int v, parsePositive(x));
    *out = 2 * v;
    return Status::ok();
}

TEST(Status, OkAndError) {
    EXPECT_TRUE(Status::ok().isOk());
    Status s = Status::invalid("bad");
    EXPECT_FALSE(s.isOk());
    EXPECT_EQ(s.code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(s.toString(), "InvalidArgument: bad");
    EXPECT_EQ(s.withContext("loading").message(), "loading: bad");
}

TEST(Status, ResultPropagates) {
    int out = 0;
    EXPECT_TRUE(useTwice(4, &out).isOk());
    EXPECT_EQ(out, 8);
    Status s = useTwice(-1, &out);
    EXPECT_EQ(s.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(s.message().find("must be positive"), std::string::npos);
}

}  // namespace
}  // namespace ts
