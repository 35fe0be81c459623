// .npy I/O: round trips for every dtype, the three format versions, and every malformed-input error.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "attn/attn.hpp"
#include "error_message.hpp"
#include "attn/io/npy.hpp"

using namespace attn;

namespace {

using Bytes = std::vector<unsigned char>;

// A .npy file by hand: magic, version major.0, the header length in 2 (1.0) or 4 (2.0, 3.0) bytes, header, data.
Bytes make_npy(unsigned major, const std::string& header, const Bytes& data) {
    Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
    const std::size_t width = major == 1 ? 2 : 4;
    for (std::size_t i = 0; i < width; ++i) out.push_back(static_cast<unsigned char>(header.size() >> (8 * i)));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

Bytes float_bytes(std::initializer_list<float> values) {
    Bytes out(values.size() * 4);
    std::memcpy(out.data(), values.begin(), out.size());
    return out;
}

// The header exactly as numpy 1.x writes it for a float32 (2, 3) array: padded with spaces to 64-byte alignment.
std::string numpy_header(const std::string& dict, std::size_t prefix = 10) {
    std::string h = dict;
    const std::size_t total = (prefix + h.size() + 1 + 63) / 64 * 64;
    h.append(total - prefix - h.size() - 1, ' ');
    return h + "\n";
}

// Expects parse() to throw IoError naming the file and containing `what`.
void require_io_error(const Bytes& bytes, const std::string& what) {
    try {
        npy::parse(bytes, "bad.npy");
        FAIL("no IoError; expected one mentioning: " << what);
    } catch (const IoError& e) {
        const std::string message = e.what();
        INFO(message);
        CHECK(message.find("bad.npy") != std::string::npos);
        CHECK(message.find(what) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("float32, float64, bool and int64 tensors survive a write and a read bitwise", "[npy]") {
    const Tensor<float> f({2, 3}, {1.5f, -0.0f, std::numeric_limits<float>::infinity(), 1e-40f, 3.25f, -7.0f});
    const auto f_back = npy::to_tensor<float>(npy::parse(npy::serialize<float>(f.view()), "f"), "f");
    REQUIRE(f_back.shape() == f.shape());
    CHECK(std::memcmp(f_back.data(), f.data(), 6 * sizeof(float)) == 0);

    const Tensor<double> d({3}, {0.1, std::numeric_limits<double>::quiet_NaN(), -2.0});
    const auto d_back = npy::to_tensor<double>(npy::parse(npy::serialize<double>(d.view()), "d"), "d");
    REQUIRE(d_back.shape() == Shape{3});
    CHECK(std::memcmp(d_back.data(), d.data(), 3 * sizeof(double)) == 0);

    const Tensor<bool> b({2, 1, 2}, {true, false, false, true});
    const auto b_back = npy::to_tensor<bool>(npy::parse(npy::serialize<bool>(b.view()), "b"), "b");
    REQUIRE(b_back.shape() == Shape{2, 1, 2});
    for (Index i = 0; i < 4; ++i) CHECK(b_back[i] == b[i]);

    const Tensor<std::int64_t> n({2}, {std::numeric_limits<std::int64_t>::min(), 42});
    const auto n_back = npy::to_tensor<std::int64_t>(npy::parse(npy::serialize<std::int64_t>(n.view()), "n"), "n");
    CHECK(n_back[0] == n[0]);
    CHECK(n_back[1] == 42);
}

TEST_CASE("float16 is '<f2'; bfloat16 is written as its bits ('<i2') and read back as bfloat16 with as_dtype", "[npy]") {
    const Tensor<float16> h({3}, {float16(1.5), float16::from_bits(0x0001), float16::from_bits(0xfc00)});
    const Bytes hb = npy::serialize<float16>(h.view());
    CHECK(std::string(hb.begin() + 10, hb.begin() + 30).find("'<f2'") != std::string::npos);
    const auto h_back = npy::to_tensor<float16>(npy::parse(hb, "h"), "h");
    for (Index i = 0; i < 3; ++i) CHECK(h_back[i].bits == h[i].bits);

    const Tensor<bfloat16> g({2, 2}, {bfloat16(-2.0), bfloat16(0.1), bfloat16::from_bits(0x7fc1), bfloat16(3e38)});
    const Bytes gb = npy::serialize<bfloat16>(g.view());
    const npy::Array bits = npy::parse(gb, "g");
    CHECK(bits.dtype == npy::DType::Int16);  // what tensor.view(torch.int16).numpy() saves
    const std::string refused = test::error_message<IoError>([&] { (void)npy::to_tensor<bfloat16>(bits, "g"); });
    CHECK_THAT(refused, Catch::Contains("int16") && Catch::Contains("bfloat16"));
    const auto g_back = npy::to_tensor<bfloat16>(npy::as_dtype(bits, npy::DType::BFloat16, "g"), "g");
    REQUIRE(g_back.shape() == Shape{2, 2});
    for (Index i = 0; i < 4; ++i) CHECK(g_back[i].bits == g[i].bits);
    // uint16 arrays hold the same patterns; float16 can come that way too.
    const Bytes u = make_npy(1, numpy_header("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }"), {0x80, 0x3f});
    CHECK(static_cast<float>(npy::to_tensor<bfloat16>(npy::as_dtype(npy::parse(u, "u"), npy::DType::BFloat16, "u"), "u")[0]) == 1.0f);
    CHECK(static_cast<float>(npy::to_tensor<float16>(npy::as_dtype(npy::parse(u, "u"), npy::DType::Float16, "u"), "u")[0]) ==
          1.875f);  // 0x3f80: exponent 15, significand 0x380 = 0.875
    // Nothing else is reinterpreted: a float32 array's values are no 16-bit patterns.
    const npy::Array f = npy::parse(npy::serialize<float>(Tensor<float>({1}, {1.0f}).view()), "f.npy");
    CHECK_THAT(test::error_message<IoError>([&] { (void)npy::as_dtype(f, npy::DType::BFloat16, "f.npy"); }),
               Catch::Contains("f.npy") && Catch::Contains("float32 [1]") && Catch::Contains("does not hold bfloat16 bits"));
    CHECK_THAT(test::error_message<IoError>([&] { (void)npy::as_dtype(f, npy::DType::Float32, "f.npy"); }),
               Catch::Contains("float16 or bfloat16 only"));
}

TEST_CASE("scalars and empty arrays round-trip with their shapes", "[npy]") {
    const Tensor<float> scalar(Shape{}, {2.5f});
    const auto s = npy::to_tensor<float>(npy::parse(npy::serialize<float>(scalar.view()), "s"), "s");
    CHECK(s.shape().empty());
    CHECK(s[0] == 2.5f);
    const Tensor<double> empty({0, 4});
    const auto e = npy::to_tensor<double>(npy::parse(npy::serialize<double>(empty.view()), "e"), "e");
    CHECK(e.shape() == Shape{0, 4});
}

TEST_CASE("the writer emits numpy's own header (version 1.0, 64-byte aligned, C order) in logical order", "[npy]") {
    // A transposed view is written in its logical C order, not in memory order.
    const Tensor<float> stored({2, 3}, {0, 1, 2, 3, 4, 5});
    const TensorView<const float> transposed = stored.view().transpose(0, 1);  // (3, 2)
    const Bytes bytes = npy::serialize<float>(transposed);
    const std::string expected = numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }");
    REQUIRE(bytes.size() == 10 + expected.size() + 6 * 4);
    CHECK(bytes[6] == 1);
    CHECK(bytes[7] == 0);
    CHECK((10 + expected.size()) % 64 == 0);
    CHECK(std::string(bytes.begin() + 10, bytes.begin() + 10 + static_cast<std::ptrdiff_t>(expected.size())) == expected);
    const auto back = npy::to_tensor<float>(npy::parse(bytes, "t"), "t");
    const float logical[] = {0, 3, 1, 4, 2, 5};
    for (Index i = 0; i < 6; ++i) CHECK(back[i] == logical[i]);

    // A rank-1 shape is written as the tuple (3,).
    const Bytes one = npy::serialize<bool>(Tensor<bool>({3}).view());
    CHECK(std::string(one.begin() + 10, one.end()).find("'shape': (3,)") != std::string::npos);
}

TEST_CASE("format versions 1.0, 2.0 and 3.0 are all readable", "[npy]") {
    const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    for (unsigned major : {1u, 2u, 3u}) {
        INFO("version " << major << ".0");
        const auto a = npy::parse(make_npy(major, numpy_header(dict, major == 1 ? 10 : 12), float_bytes({1, 2})), "v");
        CHECK(a.dtype == npy::DType::Float32);
        CHECK(a.shape == Shape{2});
        const auto t = npy::to_tensor<float>(a, "v");
        CHECK(t[0] == 1.0f);
        CHECK(t[1] == 2.0f);
    }
}

TEST_CASE("headers in other spellings numpy accepts parse too", "[npy]") {
    // Key order, double quotes, no trailing comma, Python 2 long suffix, 1-D Fortran order (same bytes as C order).
    const auto a = npy::parse(make_npy(1, "{\"shape\": (2L, 1), \"fortran_order\": True, \"descr\": \"<f4\"}\n",
                                       float_bytes({1, 2})),
                              "x");
    CHECK(a.shape == Shape{2, 1});
    const auto b = npy::parse(make_npy(1, "{'descr': '|b1', 'fortran_order': False, 'shape': ()}", {1}), "x");
    CHECK(b.dtype == npy::DType::Bool);
    CHECK(b.shape.empty());
}

TEST_CASE("a malformed preamble is an IoError naming the file", "[npy][errors]") {
    const std::string dict = numpy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }");
    require_io_error({}, "truncated");
    require_io_error({0x93, 'N', 'U', 'M', 'P'}, "truncated");
    Bytes wrong_magic = make_npy(1, dict, float_bytes({1}));
    wrong_magic[1] = 'X';
    require_io_error(wrong_magic, "not a .npy file");
    require_io_error(make_npy(4, dict, float_bytes({1})), "unsupported format version 4.0");
    Bytes minor = make_npy(1, dict, float_bytes({1}));
    minor[7] = 1;
    require_io_error(minor, "unsupported format version 1.1");
    // Version 2.0 needs a 4-byte header length: 10 bytes are not enough.
    require_io_error({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 5, 0}, "preamble needs 12");
    // A header length pointing past the end of the file must not be followed.
    Bytes long_header = make_npy(1, dict, {});
    long_header[8] = 0xff;
    long_header[9] = 0xff;
    require_io_error(long_header, "truncated header");
    Bytes huge_header = make_npy(2, dict, {});
    huge_header[11] = 0xff;
    require_io_error(huge_header, "truncated header");
}

TEST_CASE("a malformed header dict is an IoError saying what is wrong", "[npy][errors]") {
    const Bytes one = float_bytes({1});
    require_io_error(make_npy(1, "'descr': '<f4'}", one), "expected '{'");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", one), "expected ','");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False}", one), "are all required");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", one),
                     "unexpected or repeated key 'extra'");
    require_io_error(make_npy(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", one),
                     "unexpected or repeated key 'descr'");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,)}", one), "True or False");
    require_io_error(make_npy(1, "{'descr': <f4, 'fortran_order': False, 'shape': (1,)}", one), "quoted string");
    require_io_error(make_npy(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", one), "expected ','");
    require_io_error(make_npy(1, "{'descr': '<f4", one), "unterminated string");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", one),
                     "non-negative integer extent");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': 1}", one), "expected '('");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk", one),
                     "unexpected text after");
    // Non-printable bytes are escaped in the message.
    require_io_error(make_npy(1, std::string("{\x01}"), one), "\\x01");
}

TEST_CASE("shape extents and element counts that overflow are IoErrors, not wrapped sizes", "[npy][errors]") {
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", {}),
                     "overflows int64");
    // 2^32 * 2^32 elements wrap to 0 in 64-bit arithmetic, which would match an empty data section.
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", {}),
                     "more elements than int64");
    // 2^62 elements fit int64 but not 2^62 * 4 bytes.
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,)}", {}),
                     "bytes of data");
}

TEST_CASE("byte order, dtype and memory order outside the supported set are IoErrors", "[npy][errors]") {
    const Bytes one = float_bytes({1});
    require_io_error(make_npy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}", one), "big-endian");
    require_io_error(make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,)}", one),
                     "unsupported dtype '<i4'");
    require_io_error(make_npy(1, "{'descr': '<u4', 'fortran_order': False, 'shape': (1,)}", one),
                     "unsupported dtype '<u4'");
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", Bytes(24)),
                     "Fortran-order");
}

TEST_CASE("data shorter or longer than the shape says is an IoError", "[npy][errors]") {
    require_io_error(make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", Bytes(23)),
                     "(truncated)");
    require_io_error(make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}", Bytes(9)),
                     "(trailing bytes)");
    require_io_error(make_npy(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}", {0, 1, 2}),
                     "bool element 2 holds byte 2");
}

TEST_CASE("to_tensor rejects an array built by hand whose bytes do not fit its shape or dtype", "[npy][errors]") {
    npy::Array a;
    a.dtype = npy::DType::Bool;
    a.shape = {2};
    a.data = {1, 7};
    CHECK_THAT(test::error_message<IoError>([&] { (void)npy::to_tensor<bool>(a, "m.npy"); }),
               Catch::Contains("m.npy") && Catch::Contains("holds byte 7"));
    a.data = {1, 0, 1};
    CHECK_THAT(test::error_message<IoError>([&] { (void)npy::to_tensor<bool>(a, "m.npy"); }),
               Catch::Contains("m.npy") && Catch::Contains("3 data bytes for shape [2]"));
}

TEST_CASE("to_tensor names the file and both dtypes when the dtype is not the requested one", "[npy][errors]") {
    const auto a = npy::parse(npy::serialize<double>(Tensor<double>({2, 2}).view()), "x");
    try {
        (void)npy::to_tensor<float>(a, "q.npy");
        FAIL("no IoError");
    } catch (const IoError& e) {
        const std::string message = e.what();
        INFO(message);
        CHECK(message.find("q.npy") != std::string::npos);
        CHECK(message.find("float64 [2,2]") != std::string::npos);
        CHECK(message.find("expected float32") != std::string::npos);
    }
}

TEST_CASE("read_file and write_file report paths they cannot use", "[npy][errors]") {
    const auto dir = std::filesystem::temp_directory_path() / ("attn_npy_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "x.npy").string();
    npy::write_file<float>(path, Tensor<float>({2}, {1, 2}).view());
    const auto back = npy::to_tensor<float>(npy::read_file(path), path);
    CHECK(back[1] == 2.0f);
    const std::string missing = (dir / "missing.npy").string();
    const std::string read_error = test::error_message<IoError>([&] { npy::read_file(missing); });
    CHECK_THAT(read_error, Catch::Contains(missing) && Catch::Contains("cannot open"));
    const std::string unwritable = (dir / "no_such_dir" / "y.npy").string();
    const std::string write_error =
        test::error_message<IoError>([&] { npy::write_file<float>(unwritable, Tensor<float>({1}).view()); });
    CHECK_THAT(write_error, Catch::Contains(unwritable) && Catch::Contains("cannot open"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("every truncation and random byte damage of a valid file is an IoError or a consistent array",
          "[npy][errors]") {
    // Each candidate lives in its own exactly-sized heap buffer, so ASan flags any read past its end.
    const Bytes valid = npy::serialize<double>(Tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6}).view());
    for (std::size_t n = 0; n < valid.size(); ++n) {
        const Bytes cut(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(n));
        INFO("first " << n << " bytes");
        test::error_message<IoError>([&] { npy::parse(cut, "cut.npy"); });
    }
    std::mt19937_64 rng(31);  // fixed seed: the same damage every run
    std::size_t parsed = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        Bytes damaged = valid;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) {
            // Mostly the preamble and header, where the parser's decisions are.
            const std::size_t at = rng() % 4 ? rng() % 80 : rng() % damaged.size();
            damaged[at] = static_cast<unsigned char>(rng());
        }
        try {
            const npy::Array a = npy::parse(Bytes(damaged), "damaged.npy");
            CHECK(a.data.size() == static_cast<std::size_t>(numel(a.shape)) * npy::item_size(a.dtype));
            ++parsed;
        } catch (const IoError& e) {
            CHECK_THAT(std::string(e.what()), Catch::Contains("damaged.npy"));
        }
    }
    std::cout << "npy damage: " << parsed << " of 2000 damaged files still parsed (consistently)\n";
}
