// Data: Megatron indexed dataset round trip and errors, byte tokenizer, shuffled sampling.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include "engine/train/data.h"
#include "engine/train/tokenizer.h"

namespace ts::engine {
namespace {

namespace fs = std::filesystem;

std::string tempPrefix(const std::string& name) {
    const fs::path d = fs::temp_directory_path() / ("ts_data_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return (d / name).string();
}

TEST(IndexedDataset, WritesAndReadsBackBothDtypes) {
    const std::vector<std::vector<int32_t>> seqs = {{1, 2, 3}, {}, {65535, 0, 7, 9}, {42}};
    for (uint8_t code : {uint8_t(4), uint8_t(8)}) {
        const std::string prefix = tempPrefix("rt" + std::to_string(code));
        ASSERT_TRUE(writeIndexedDataset(prefix, seqs, code).isOk());
        // Header by hand (independent of the reader): magic, version 1, dtype code, counts.
        std::ifstream in(prefix + ".idx", std::ios::binary);
        char magic[9];
        in.read(magic, 9);
        EXPECT_EQ(std::string(magic, 9), std::string("MMIDIDX\0\0", 9));
        uint64_t version = 0, nseq = 0;
        uint8_t dt = 0;
        in.read(reinterpret_cast<char*>(&version), 8);
        in.read(reinterpret_cast<char*>(&dt), 1);
        in.read(reinterpret_cast<char*>(&nseq), 8);
        EXPECT_EQ(version, 1u);
        EXPECT_EQ(dt, code);
        EXPECT_EQ(nseq, 4u);
        EXPECT_EQ(fs::file_size(prefix + ".bin"), uint64_t(8) * (code == 4 ? 4 : 2));

        auto ds = readIndexedDataset(prefix);
        ASSERT_TRUE(ds.isOk()) << ds.status().toString();
        EXPECT_EQ(ds->dtypeCode, code);
        EXPECT_EQ(ds->sequenceLengths, (std::vector<int32_t>{3, 0, 4, 1}));
        const int es = code == 4 ? 4 : 2;
        EXPECT_EQ(ds->sequencePointers, (std::vector<int64_t>{0, 3 * es, 3 * es, 7 * es}));
        EXPECT_EQ(ds->tokens, (std::vector<int32_t>{1, 2, 3, 65535, 0, 7, 9, 42}));
    }
}

TEST(IndexedDataset, BadFilesGiveClearErrors) {
    const std::string prefix = tempPrefix("bad");
    EXPECT_EQ(readIndexedDataset(prefix + "_missing").status().code(), ErrorCode::NotFound);
    ASSERT_TRUE(writeIndexedDataset(prefix, {{1, 2, 3}}, 4).isOk());
    {  // truncated .bin
        std::ofstream b(prefix + ".bin", std::ios::binary | std::ios::trunc);
        b.write("\1\0\0\0", 4);
    }
    auto r = readIndexedDataset(prefix);
    EXPECT_EQ(r.status().code(), ErrorCode::InvalidArgument);
    {  // bad magic
        std::ofstream i(prefix + ".idx", std::ios::binary | std::ios::trunc);
        i << "NOTANIDXFILE";
    }
    r = readIndexedDataset(prefix);
    EXPECT_EQ(r.status().code(), ErrorCode::InvalidArgument);
    EXPECT_NE(r.status().message().find("MMIDIDX"), std::string::npos);
    EXPECT_EQ(writeIndexedDataset(prefix, {{70000}}, 8).code(), ErrorCode::InvalidArgument);
}

TEST(ByteTokenizer, RoundTrips) {
    ByteTokenizer t;
    const std::string s = "In the beginning\n\x01\xff";
    const auto ids = t.encode(s);
    ASSERT_EQ(ids.size(), s.size());
    EXPECT_EQ(ids[0], 'I');
    EXPECT_EQ(ids.back(), 255);
    EXPECT_EQ(t.decode(ids), s);
}

TEST(DataSource, SamplesAreShuffledWindowsAndDeterministic) {
    std::vector<int32_t> toks(1001);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i % 250);
    auto a = DataSource::fromTokens(toks, 10, 5, "test");
    auto b = DataSource::fromTokens(toks, 10, 5, "test");
    ASSERT_TRUE(a.isOk());
    EXPECT_EQ((*a)->samplesPerEpoch(), 100);
    std::set<int32_t> starts;
    for (int64_t k = 0; k < 100; ++k) {
        auto mb = (*a)->microbatch(k, 1);
        auto mb2 = (*b)->microbatch(k, 1);
        EXPECT_EQ(mb->tokens, mb2->tokens);
        // window: labels are tokens shifted by one
        for (int i = 0; i + 1 < 10; ++i) EXPECT_EQ(mb->labels[size_t(i)], mb->tokens[size_t(i + 1)]);
        starts.insert(mb->tokens[0]);
    }
    EXPECT_EQ(starts.size(), 25u);  // every window start k*10 % 250 appears: a permutation of the epoch
    // sequence-first layout: column j of a b=2 microbatch is sample first+j
    auto two = (*a)->microbatch(4, 2);
    auto s4 = (*a)->microbatch(4, 1), s5 = (*a)->microbatch(5, 1);
    for (int i = 0; i < 10; ++i) {
        EXPECT_EQ(two->tokens[size_t(i) * 2], s4->tokens[size_t(i)]);
        EXPECT_EQ(two->tokens[size_t(i) * 2 + 1], s5->tokens[size_t(i)]);
    }
    EXPECT_FALSE(DataSource::fromTokens({1, 2}, 10, 5, "short").isOk());
}

TEST(DataSource, ShippedCorpusIsThere) {
    Config c;
    c.vocab_size = 256;
    c.seq_length = 128;
    auto d = DataSource::open(c);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    EXPECT_GT((*d)->samplesPerEpoch(), 1000);
}

}  // namespace
}  // namespace ts::engine
