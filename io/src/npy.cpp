// .npy reader and writer. The reader trusts nothing: every length, extent and byte count is checked before use.
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "file_bytes.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace attn::npy {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader copies little-endian element bytes as they are; add byte swapping for this host");

const char* to_string(DType dtype) {
    switch (dtype) {
        case DType::Float32: return "float32";
        case DType::Float64: return "float64";
        case DType::Float16: return "float16";
        case DType::BFloat16: return "bfloat16";
        case DType::Bool: return "bool";
        case DType::Int64: return "int64";
        case DType::Int16: return "int16";
        case DType::UInt16: return "uint16";
    }
    return "?";
}

std::size_t item_size(DType dtype) {
    switch (dtype) {
        case DType::Float32: return 4;
        case DType::Float64: return 8;
        case DType::Float16:
        case DType::BFloat16:
        case DType::Int16:
        case DType::UInt16: return 2;
        case DType::Bool: return 1;
        case DType::Int64: return 8;
    }
    return 0;
}

namespace {

constexpr unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(const std::string& name, const std::string& what) { throw IoError("npy: " + name + ": " + what); }

// A cursor over the header text (a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }), never reading past its end.
class HeaderParser {
public:
    HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
            ++pos_;
    }
    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }
    bool accept(char c) {
        skip_space();
        if (peek() != c) return false;
        ++pos_;
        return true;
    }
    void expect(char c, const char* where) {
        if (!accept(c)) error(std::string("expected '") + c + "' " + where);
    }
    std::string string_literal() {
        skip_space();
        const char quote = peek();
        if (quote != '\'' && quote != '"') error("expected a quoted string");
        const std::size_t start = ++pos_;
        while (!at_end() && text_[pos_] != quote) {
            if (text_[pos_] == '\\') error("escape sequences are not supported in header strings");
            ++pos_;
        }
        if (at_end()) error("unterminated string");
        return std::string(text_.substr(start, pos_++ - start));
    }
    bool bool_literal() {
        skip_space();
        if (text_.substr(pos_, 4) == "True") {
            pos_ += 4;
            return true;
        }
        if (text_.substr(pos_, 5) == "False") {
            pos_ += 5;
            return false;
        }
        error("expected True or False");
    }
    // (), (n,), (n, m), (n, m,): non-negative extents, each fitting Index.
    Shape shape_tuple() {
        expect('(', "to open the shape tuple");
        Shape shape;
        while (true) {
            skip_space();
            if (accept(')')) break;
            if (peek() < '0' || peek() > '9') error("expected a non-negative integer extent in the shape");
            Index extent = 0;
            while (!at_end() && peek() >= '0' && peek() <= '9') {
                const Index digit = peek() - '0';
                if (extent > (std::numeric_limits<Index>::max() - digit) / 10) error("a shape extent overflows int64");
                extent = extent * 10 + digit;
                ++pos_;
            }
            accept('L');  // Python 2 long suffix, written by old numpy versions
            shape.push_back(extent);
            if (accept(')')) break;
            expect(',', "between shape extents");
        }
        return shape;
    }
    [[noreturn]] void error(const std::string& what) const {
        // Quote at most 120 header characters, non-printable bytes escaped, so a hostile header stays readable.
        std::string quoted;
        for (std::size_t i = 0; i < text_.size() && i < 120; ++i) {
            const auto c = static_cast<unsigned char>(text_[i]);
            if (c >= 0x20 && c < 0x7f) {
                quoted += static_cast<char>(c);
            } else {
                const char hex[] = "0123456789abcdef";
                quoted += std::string("\\x") + hex[c >> 4] + hex[c & 15];
            }
        }
        if (text_.size() > 120) quoted += "...";
        fail(name_, "malformed header at offset " + std::to_string(pos_) + ": " + what + " in \"" + quoted + "\"");
    }

private:
    std::string_view text_;
    const std::string& name_;
    std::size_t pos_ = 0;
};

DType parse_descr(const std::string& descr, const std::string& name) {
    if (descr.size() >= 2 && descr[0] == '>' && descr != ">b1" && descr != ">i1" && descr != ">u1")
        fail(name, "dtype '" + descr + "' is big-endian; only little-endian files are supported (use arr.astype('<" +
                       descr.substr(1) + "'))");
    if (descr == "<f4") return DType::Float32;
    if (descr == "<f8") return DType::Float64;
    if (descr == "|b1" || descr == "<b1" || descr == ">b1" || descr == "=b1") return DType::Bool;
    if (descr == "<i8") return DType::Int64;
    if (descr == "<f2") return DType::Float16;
    if (descr == "<i2") return DType::Int16;
    if (descr == "<u2") return DType::UInt16;
    fail(name, "unsupported dtype '" + descr +
                   "' (supported: '<f4' float32, '<f8' float64, '<f2' float16, '|b1' bool, '<i8' int64, and '<i2' or "
                   "'<u2' holding bfloat16 or float16 bits, read with --dtype)");
}

std::uint32_t read_le(std::span<const unsigned char> bytes, std::size_t offset, std::size_t width) {
    std::uint32_t value = 0;
    for (std::size_t i = 0; i < width; ++i) value |= static_cast<std::uint32_t>(bytes[offset + i]) << (8 * i);
    return value;
}

}  // namespace

Array parse(std::span<const unsigned char> bytes, const std::string& name) {
    // 1. preamble: magic (6), version (2), header length (2 bytes in 1.0, 4 in 2.0/3.0), little-endian.
    if (bytes.size() < 10) fail(name, "truncated: " + std::to_string(bytes.size()) + " bytes, a .npy preamble needs at least 10");
    if (std::memcmp(bytes.data(), magic, sizeof magic) != 0) fail(name, "not a .npy file (the magic string \\x93NUMPY is missing)");
    const unsigned major = bytes[6], minor = bytes[7];
    if (major < 1 || major > 3 || minor != 0)
        fail(name, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor) +
                       " (supported: 1.0, 2.0, 3.0)");
    const std::size_t length_width = major == 1 ? 2 : 4;
    const std::size_t prefix = 8 + length_width;
    if (bytes.size() < prefix)
        fail(name, "truncated: " + std::to_string(bytes.size()) + " bytes, a version " + std::to_string(major) +
                       ".0 preamble needs " + std::to_string(prefix));
    const std::size_t header_length = read_le(bytes, 8, length_width);
    if (header_length > bytes.size() - prefix)
        fail(name, "truncated header: it declares " + std::to_string(header_length) + " bytes but only " +
                       std::to_string(bytes.size() - prefix) + " follow the preamble");

    // 2. header dict: exactly the keys descr, fortran_order and shape.
    const std::string_view header(reinterpret_cast<const char*>(bytes.data() + prefix), header_length);
    HeaderParser parser(header, name);
    std::string descr;
    bool fortran_order = false;
    Shape shape;
    bool has_descr = false, has_order = false, has_shape = false;
    parser.expect('{', "to open the header dict");
    while (!parser.accept('}')) {
        const std::string key = parser.string_literal();
        parser.expect(':', "after a dict key");
        if (key == "descr" && !has_descr) {
            descr = parser.string_literal();
            has_descr = true;
        } else if (key == "fortran_order" && !has_order) {
            fortran_order = parser.bool_literal();
            has_order = true;
        } else if (key == "shape" && !has_shape) {
            shape = parser.shape_tuple();
            has_shape = true;
        } else {
            parser.error("unexpected or repeated key '" + key + "'");
        }
        if (parser.accept('}')) break;
        parser.expect(',', "between dict entries");
    }
    parser.skip_space();
    if (!parser.at_end()) parser.error("unexpected text after the header dict");
    if (!has_descr || !has_order || !has_shape) parser.error("the keys descr, fortran_order and shape are all required");

    // 3. dtype, order, and an element count that fits and matches the bytes present.
    Array array;
    array.dtype = parse_descr(descr, name);
    if (fortran_order && shape.size() > 1) {
        Index non_trivial = 0;
        for (Index s : shape) non_trivial += s > 1;
        if (non_trivial > 1) fail(name, "Fortran-order arrays are not supported (shape " + attn::to_string(shape) + "); save with C order");
    }
    const std::size_t item = item_size(array.dtype);
    Index count = 1;
    Index span = 1;  // product of max(extent, 1): what a tensor's strides need, even when an extent is 0
    for (Index s : shape) {
        if (s != 0 && count > std::numeric_limits<Index>::max() / s)
            fail(name, "shape " + attn::to_string(shape) + " has more elements than int64 can count");
        count *= s;
        if (span > std::numeric_limits<Index>::max() / std::max<Index>(s, 1))
            fail(name, "shape " + attn::to_string(shape) + " has strides that do not fit int64");
        span *= std::max<Index>(s, 1);
    }
    const std::size_t data_bytes = bytes.size() - prefix - header_length;
    if (static_cast<std::uint64_t>(count) > std::numeric_limits<std::size_t>::max() / item ||
        static_cast<std::size_t>(count) * item != data_bytes)
        fail(name, "shape " + attn::to_string(shape) + " of " + to_string(array.dtype) + " needs " + std::to_string(count) +
                       " x " + std::to_string(item) + " bytes of data but the file holds " + std::to_string(data_bytes) +
                       (data_bytes < static_cast<std::size_t>(count) * item ? " (truncated)" : " (trailing bytes)"));
    const unsigned char* first = bytes.data() + prefix + header_length;
    if (array.dtype == DType::Bool)
        for (std::size_t i = 0; i < data_bytes; ++i)
            if (first[i] > 1)
                fail(name, "bool element " + std::to_string(i) + " holds byte " + std::to_string(first[i]) + " (expected 0 or 1)");
    array.shape = std::move(shape);
    array.data.assign(first, first + data_bytes);
    return array;
}

Array read_file(const std::string& path) {
    if (std::string file, name; safetensors::split_path(path, &file, &name)) return safetensors::read_tensor(file, name);
    return parse(io_detail::read_bytes(path, "npy"), path);
}

Array as_dtype(Array array, DType dtype, const std::string& name) {
    if (dtype != DType::Float16 && dtype != DType::BFloat16)
        fail(name, std::string("can be read as float16 or bfloat16 only, not as ") + to_string(dtype));
    if (array.dtype == dtype) return array;
    if (array.dtype != DType::Int16 && array.dtype != DType::UInt16)
        fail(name, "has dtype " + std::string(to_string(array.dtype)) + " " + attn::to_string(array.shape) +
                       ", which does not hold " + to_string(dtype) + " bits (an int16 or uint16 array does: " +
                       "tensor.view(torch.int16).numpy())");
    array.dtype = dtype;  // the same little-endian 16-bit patterns
    return array;
}

template <class T>
Tensor<T> to_tensor(const Array& array, const std::string& name) {
    if (array.dtype != dtype_of<T>())
        fail(name, "has dtype " + std::string(to_string(array.dtype)) + " " + attn::to_string(array.shape) + ", expected " +
                       to_string(dtype_of<T>()));
    if constexpr (std::is_same_v<T, bool>) {
        // An Array built by hand skipped parse()'s check; a bool holding another byte is undefined behaviour.
        for (std::size_t i = 0; i < array.data.size(); ++i)
            if (array.data[i] > 1)
                fail(name, "bool element " + std::to_string(i) + " holds byte " + std::to_string(array.data[i]) +
                               " (expected 0 or 1)");
    }
    Tensor<T> tensor(array.shape);
    if (array.data.size() != static_cast<std::size_t>(tensor.numel()) * sizeof(T))
        fail(name, "holds " + std::to_string(array.data.size()) + " data bytes for shape " + attn::to_string(array.shape));
    if (!array.data.empty()) std::memcpy(static_cast<void*>(tensor.data()), array.data.data(), array.data.size());
    return tensor;
}

template <class T>
std::vector<unsigned char> serialize(TensorView<const T> tensor) {
    // Header: the dict, padded with spaces and a final newline so the data starts at a multiple of 64.
    std::string dict = "{'descr': '";
    dict += dtype_of<T>() == DType::Float32    ? "<f4"
            : dtype_of<T>() == DType::Float64  ? "<f8"
            : dtype_of<T>() == DType::Float16  ? "<f2"
            : dtype_of<T>() == DType::BFloat16 ? "<i2"  // its bits: NumPy has no bfloat16
            : dtype_of<T>() == DType::Bool     ? "|b1"
                                               : "<i8";
    dict += "', 'fortran_order': False, 'shape': (";
    for (Index d = 0; d < tensor.rank(); ++d) dict += (d ? ", " : "") + std::to_string(tensor.dim(d));
    dict += tensor.rank() == 1 ? ",)" : ")";  // (3,) is a tuple, (3) is not
    dict += ", }";
    const auto padded_length = [&](std::size_t prefix) { return (prefix + dict.size() + 1 + 63) / 64 * 64 - prefix; };
    const bool v2 = padded_length(10) > 65535;  // format 1.0 stores the header length in 16 bits
    const std::size_t prefix = v2 ? 12 : 10;
    const std::size_t header_length = padded_length(prefix);
    dict.append(header_length - dict.size() - 1, ' ');
    dict += '\n';

    std::vector<unsigned char> out(magic, magic + sizeof magic);
    out.push_back(v2 ? 2 : 1);
    out.push_back(0);
    for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<unsigned char>(header_length >> (8 * i)));
    out.insert(out.end(), dict.begin(), dict.end());
    const Array array = to_array<T>(tensor);
    out.insert(out.end(), array.data.begin(), array.data.end());
    return out;
}

template <class T>
Array to_array(TensorView<const T> tensor) {
    Array array{dtype_of<T>(), tensor.shape(), std::vector<unsigned char>(static_cast<std::size_t>(tensor.numel()) * sizeof(T))};
    std::size_t at = 0;
    for_each_index(tensor.shape(), [&](std::span<const Index> idx) {
        const T value = tensor.at(idx);
        std::memcpy(array.data.data() + at, &value, sizeof(T));
        at += sizeof(T);
    });
    return array;
}

template <class T>
void write_file(const std::string& path, TensorView<const T> tensor) {
    if (std::string file, name; safetensors::split_path(path, &file, &name))
        return safetensors::write_file(file, {{name, to_array<T>(tensor)}});
    io_detail::write_bytes(path, serialize<T>(tensor), "npy");
}

#define ATTN_NPY_INSTANTIATE(T)                                                       \
    template Tensor<T> to_tensor<T>(const Array&, const std::string&);                \
    template std::vector<unsigned char> serialize<T>(TensorView<const T>);            \
    template Array to_array<T>(TensorView<const T>);                                  \
    template void write_file<T>(const std::string&, TensorView<const T>);
ATTN_NPY_INSTANTIATE(float)
ATTN_NPY_INSTANTIATE(double)
ATTN_NPY_INSTANTIATE(float16)
ATTN_NPY_INSTANTIATE(bfloat16)
ATTN_NPY_INSTANTIATE(bool)
ATTN_NPY_INSTANTIATE(std::int64_t)
#undef ATTN_NPY_INSTANTIATE

}  // namespace attn::npy
