// .safetensors read and write (attn/io/safetensors.hpp).
#include "attn/io/safetensors.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "attn/error.hpp"
#include "file_bytes.hpp"

namespace attn::safetensors {

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
    throw IoError("safetensors: " + name + ": " + what);
}

struct DtypeName {
    const char* name;
    npy::DType dtype;
};
constexpr DtypeName kDtypes[] = {{"F32", npy::DType::Float32}, {"F64", npy::DType::Float64},
                                 {"F16", npy::DType::Float16},  {"BF16", npy::DType::BFloat16},
                                 {"BOOL", npy::DType::Bool},    {"I64", npy::DType::Int64},
                                 {"I16", npy::DType::Int16},    {"U16", npy::DType::UInt16}};

const char* name_of(npy::DType d) {
    for (const DtypeName& n : kDtypes)
        if (n.dtype == d) return n.name;
    return "?";
}

// The header's nesting depth, strings skipped: the format needs 3 ({name: {data_offsets: [..]}}); a deeper one is
// refused before the JSON parser sees it (a parser's recursion on 50 million brackets is a stack overflow).
std::size_t nesting_depth(std::string_view text) {
    std::size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            deepest = std::max(deepest, ++depth);
        } else if ((c == '}' || c == ']') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

std::uint64_t checked_numel(const Shape& shape, const std::string& name, const std::string& tensor) {
    std::uint64_t n = 1;
    for (Index d : shape) {
        if (d < 0) fail(name, "tensor '" + tensor + "' has a negative dim in shape " + attn::to_string(shape));
        if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(d))
            fail(name, "tensor '" + tensor + "' has a shape whose size overflows: " + attn::to_string(shape));
        n *= static_cast<std::uint64_t>(d);
    }
    return n;
}

}  // namespace

std::vector<Entry> parse(std::span<const unsigned char> bytes, const std::string& name) {
    if (bytes.size() < 8) fail(name, "truncated: " + std::to_string(bytes.size()) + " bytes, less than the 8-byte header length");
    std::uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | bytes[static_cast<std::size_t>(i)];
    if (header_bytes > max_header_bytes)
        fail(name, "header length " + std::to_string(header_bytes) + " exceeds the format's limit of " +
                       std::to_string(max_header_bytes) + " bytes");
    if (header_bytes > bytes.size() - 8)
        fail(name, "truncated: the header length says " + std::to_string(header_bytes) + " bytes, the file has " +
                       std::to_string(bytes.size() - 8) + " after the length");
    const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), static_cast<std::size_t>(header_bytes));
    if (nesting_depth(text) > 3) fail(name, "header nested deeper than the format's {name: {key: [..]}}");
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(name, std::string("header is not JSON: ") + e.what());
    }
    if (!header.is_object()) fail(name, "header is not a JSON object");
    const std::span<const unsigned char> buffer = bytes.subspan(8 + static_cast<std::size_t>(header_bytes));
    std::vector<Entry> entries;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [begin, end) of each tensor, for holes and overlaps
    for (const auto& [key, info] : header.items()) {
        if (key == "__metadata__") {
            if (!info.is_object()) fail(name, "__metadata__ is not an object");
            continue;
        }
        const std::string what = "tensor '" + key + "'";
        if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
            fail(name, what + " needs dtype, shape and data_offsets");
        const nlohmann::json& dtype = info["dtype"];
        if (!dtype.is_string()) fail(name, what + ": dtype is not a string");
        const std::string dtype_name = dtype.get<std::string>();
        Entry e;
        e.name = key;
        const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                        [&](const DtypeName& d) { return dtype_name == d.name; });
        if (known == std::end(kDtypes))
            fail(name, what + " has dtype " + dtype_name + ", which is no dtype attn reads (F32, F64, F16, BF16, BOOL, I64, "
                           "I16, U16)");
        e.array.dtype = known->dtype;
        const nlohmann::json& shape = info["shape"];
        if (!shape.is_array()) fail(name, what + ": shape is not an array");
        for (const auto& d : shape) {
            if (!d.is_number_integer()) fail(name, what + ": shape holds something other than integers");
            e.array.shape.push_back(d.get<Index>());
        }
        const std::uint64_t numel = checked_numel(e.array.shape, name, key);
        const nlohmann::json& offsets = info["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
            fail(name, what + ": data_offsets must be two non-negative integers [begin, end]");
        const std::uint64_t begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
        if (begin > end || end > buffer.size())
            fail(name, what + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                           "] outside the " + std::to_string(buffer.size()) + "-byte buffer");
        const std::size_t item = npy::item_size(e.array.dtype);
        if (numel > std::numeric_limits<std::uint64_t>::max() / item || end - begin != numel * item)
            fail(name, what + " has " + std::to_string(end - begin) + " bytes for shape " + attn::to_string(e.array.shape) +
                           " of " + dtype_name + ", which needs " + std::to_string(numel * item));
        e.array.data.assign(buffer.begin() + static_cast<std::ptrdiff_t>(begin), buffer.begin() + static_cast<std::ptrdiff_t>(end));
        spans.emplace_back(begin, end);
        entries.push_back(std::move(e));
    }
    // The buffer is indexed entirely, without overlaps or holes (the format's rule).
    std::sort(spans.begin(), spans.end());
    std::uint64_t covered = 0;
    for (const auto& [begin, end] : spans) {
        if (begin < covered) fail(name, "tensors overlap at byte " + std::to_string(begin) + " of the buffer");
        if (begin > covered) fail(name, "bytes " + std::to_string(covered) + " to " + std::to_string(begin) + " of the buffer belong to no tensor");
        covered = end;
    }
    if (covered != buffer.size())
        fail(name, "bytes " + std::to_string(covered) + " to " + std::to_string(buffer.size()) + " of the buffer belong to no tensor");
    return entries;
}

std::vector<Entry> read_file(const std::string& path) {
    return parse(io_detail::read_bytes(path, "safetensors"), path);
}

npy::Array read_tensor(const std::string& path, const std::string& tensor) {
    std::vector<Entry> entries = read_file(path);
    std::string names;
    for (Entry& e : entries) {
        if (e.name == tensor) return std::move(e.array);
        names += (names.empty() ? "" : ", ") + e.name;
    }
    fail(path, "has no tensor '" + tensor + "'; it has: " + (names.empty() ? "none" : names));
}

bool split_path(const std::string& path, std::string* file, std::string* tensor) {
    const std::string ext = ".safetensors:";
    const std::size_t at = path.rfind(ext);
    if (at == std::string::npos) return false;
    *file = path.substr(0, at + ext.size() - 1);
    *tensor = path.substr(at + ext.size());
    return true;
}

std::vector<unsigned char> serialize(const std::vector<Entry>& entries) {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    std::uint64_t offset = 0;
    for (const Entry& e : entries) {
        const std::uint64_t n = e.array.data.size();
        header[e.name] = {{"dtype", name_of(e.array.dtype)}, {"shape", e.array.shape}, {"data_offsets", {offset, offset + n}}};
        offset += n;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-byte aligned
    std::vector<unsigned char> out;
    out.reserve(8 + text.size() + offset);
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(text.size() >> (8 * i)));
    for (char c : text) out.push_back(static_cast<unsigned char>(c));
    for (const Entry& e : entries) out.insert(out.end(), e.array.data.begin(), e.array.data.end());
    return out;
}

void write_file(const std::string& path, const std::vector<Entry>& entries) {
    io_detail::write_bytes(path, serialize(entries), "safetensors");
}

}  // namespace attn::safetensors
