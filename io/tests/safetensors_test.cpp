// .safetensors I/O: files built by hand after the format's description read back exactly, round trips through
// FILE.safetensors:NAME, and every malformed input refused with what is wrong.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "attn/attn.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "error_message.hpp"

using namespace attn;

namespace {

using Bytes = std::vector<unsigned char>;

// A file by hand: the header length (8 bytes, little-endian), the header text, the buffer.
Bytes make_file(const std::string& header, const Bytes& buffer, std::uint64_t length_override = 0) {
    const std::uint64_t n = length_override ? length_override : header.size();
    Bytes out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), buffer.begin(), buffer.end());
    return out;
}

Bytes float_bytes(std::initializer_list<float> values) {
    Bytes b(values.size() * 4);
    std::memcpy(b.data(), values.begin(), b.size());
    return b;
}

std::string refusal(const Bytes& file) {
    return test::error_message<IoError>([&] { safetensors::parse(file, "t.safetensors"); });
}

std::string scratch_path(const std::string& leaf) {
    return (std::filesystem::temp_directory_path() / ("attn_safetensors_" + std::to_string(getpid()) + "_" + leaf)).string();
}

}  // namespace

TEST_CASE("a file written after the format's description reads back exactly, metadata ignored", "[safetensors]") {
    const std::string header = R"({"__metadata__":{"format":"pt"},"q":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                               R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})";
    Bytes buffer = float_bytes({1.5f, -2.0f, 0.25f, 8.0f});
    buffer.insert(buffer.end(), {1, 0, 1});
    const std::vector<safetensors::Entry> entries = safetensors::parse(make_file(header, buffer), "t.safetensors");
    REQUIRE(entries.size() == 2);
    const auto q = std::find_if(entries.begin(), entries.end(), [](const auto& e) { return e.name == "q"; });
    REQUIRE(q != entries.end());
    const Tensor<float> t = npy::to_tensor<float>(q->array, "q");
    CHECK(t.shape() == Shape{2, 2});
    CHECK(t[0] == 1.5f);
    CHECK(t[3] == 8.0f);
    const auto m = std::find_if(entries.begin(), entries.end(), [](const auto& e) { return e.name == "m"; });
    CHECK(npy::to_tensor<bool>(m->array, "m")[1] == false);
}

TEST_CASE("FILE.safetensors:NAME reads and writes one tensor wherever a .npy path goes", "[safetensors]") {
    const std::string path = scratch_path("round.safetensors");
    Tensor<double> x({2, 3});
    for (Index i = 0; i < x.numel(); ++i) x[i] = 0.1 * static_cast<double>(i) - 0.2;
    // A transposed view: written in C order of its own shape.
    const TensorView<const double> xt(x.data(), {3, 2}, {1, 3});
    npy::write_file<double>(path + ":out", xt);
    const Tensor<double> back = npy::to_tensor<double>(npy::read_file(path + ":out"), "out");
    REQUIRE(back.shape() == Shape{3, 2});
    for (Index i = 0; i < 3; ++i)
        for (Index j = 0; j < 2; ++j) CHECK(back[i * 2 + j] == x[j * 3 + i]);
    // The buffer starts 8-byte aligned, and the bytes are the format's own.
    const std::vector<safetensors::Entry> entries = safetensors::read_file(path);
    CHECK(entries.size() == 1);
    CHECK_THAT(test::error_message<IoError>([&] { npy::read_file(path + ":missing"); }),
               Catch::Contains("has no tensor 'missing'; it has: out"));
    std::filesystem::remove(path);
}

TEST_CASE("serialize writes what parse reads, several tensors in order", "[safetensors]") {
    const Tensor<float> a({2}, {1.0f, 2.0f});
    const Tensor<std::int64_t> b({1, 2}, {7, -9});
    const Bytes bytes = safetensors::serialize({{"a", npy::to_array<float>(a.view())}, {"b", npy::to_array<std::int64_t>(b.view())}});
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | bytes[static_cast<std::size_t>(i)];
    CHECK((8 + header) % 8 == 0);
    const std::vector<safetensors::Entry> back = safetensors::parse(bytes, "s");
    REQUIRE(back.size() == 2);
    CHECK(npy::to_tensor<std::int64_t>(back[1].array, "b")[1] == -9);
}

TEST_CASE("BF16 and F16 tensors read and write as attn's 16-bit types, bit for bit", "[safetensors]") {
    // As PyTorch's safetensors.torch.save_file writes a bfloat16 [2] and a float16 [1] tensor.
    const std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                               R"("h":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}})";
    const Bytes buffer = {0x80, 0x3f, 0xc0, 0xbf, 0x00, 0x3c};  // 1.0, -1.5 in bfloat16; 1.0 in float16
    const auto entries = safetensors::parse(make_file(header, buffer), "t.safetensors");
    REQUIRE(entries.size() == 2);
    const Tensor<bfloat16> b = npy::to_tensor<bfloat16>(entries[0].array, "b");
    CHECK(static_cast<float>(b[0]) == 1.0f);
    CHECK(static_cast<float>(b[1]) == -1.5f);
    CHECK(static_cast<float>(npy::to_tensor<float16>(entries[1].array, "h")[0]) == 1.0f);
    // Through FILE.safetensors:NAME.
    const std::string path = scratch_path("half.safetensors");
    const Tensor<bfloat16> g({2, 3}, {bfloat16(0.1), bfloat16(-7.0), bfloat16(1e-39), bfloat16(2.0), bfloat16(3.0),
                                      bfloat16::from_bits(0xff80)});
    npy::write_file<bfloat16>(path + ":g", g.view());
    const npy::Array back = npy::read_file(path + ":g");
    CHECK(back.dtype == npy::DType::BFloat16);
    const Tensor<bfloat16> g_back = npy::to_tensor<bfloat16>(back, "g");
    for (Index i = 0; i < 6; ++i) CHECK(g_back[i].bits == g[i].bits);
    std::filesystem::remove(path);
}

TEST_CASE("malformed files are refused with what is wrong, never read past their end", "[safetensors]") {
    const Bytes two = float_bytes({1.0f, 2.0f});
    const auto one = [&](const std::string& entry, const Bytes& buffer) { return make_file("{\"x\":" + entry + "}", buffer); };
    CHECK_THAT(refusal(Bytes{1, 2, 3}), Catch::Contains("truncated: 3 bytes, less than the 8-byte header length"));
    CHECK_THAT(refusal(make_file("{}", {}, 200'000'000)), Catch::Contains("exceeds the format's limit of 100000000 bytes"));
    CHECK_THAT(refusal(make_file("{}", {}, 50)), Catch::Contains("truncated: the header length says 50 bytes"));
    CHECK_THAT(refusal(make_file("{\"x\":", {})), Catch::Contains("header is not JSON"));
    CHECK_THAT(refusal(make_file("[1,2]", {})), Catch::Contains("header is not a JSON object"));
    CHECK_THAT(refusal(make_file(std::string(1000, '[') + std::string(1000, ']'), {})), Catch::Contains("nested deeper"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[2]})", two)), Catch::Contains("tensor 'x' needs dtype, shape and data_offsets"));
    CHECK_THAT(refusal(one(R"({"dtype":"BF16","shape":[3],"data_offsets":[0,4]})", Bytes(4))),
               Catch::Contains("has 4 bytes for shape [3] of BF16, which needs 6"));
    CHECK_THAT(refusal(one(R"({"dtype":"C64","shape":[2],"data_offsets":[0,16]})", Bytes(16))),
               Catch::Contains("which is no dtype attn reads"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,16]})", two)),
               Catch::Contains("data_offsets [0, 16] outside the 8-byte buffer"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", two)),
               Catch::Contains("has 8 bytes for shape [3] of F32, which needs 12"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", two)), Catch::Contains("negative dim"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[2],"data_offsets":[-1,8]})", two)),
               Catch::Contains("data_offsets must be two non-negative integers"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]})", two)),
               Catch::Contains("overflows"));
    CHECK_THAT(refusal(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two)),
               Catch::Contains("tensors overlap at byte 4"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})", two)),
               Catch::Contains("bytes 0 to 4 of the buffer belong to no tensor"));
    CHECK_THAT(refusal(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})", two)),
               Catch::Contains("bytes 4 to 8 of the buffer belong to no tensor"));
    CHECK_THAT(test::error_message<IoError>([] { safetensors::read_file("/nonexistent/x.safetensors"); }),
               Catch::Contains("cannot open for reading"));
}
