// io/src/file_bytes.hpp: a whole file's bytes in and out, for every format of the I/O library; errors are IoErrors
// "<format>: <path>: what went wrong".
#pragma once

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "attn/error.hpp"

namespace attn::io_detail {

inline std::vector<unsigned char> read_bytes(const std::string& path, const std::string& format) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(format + ": " + path + ": cannot open for reading");
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw IoError(format + ": " + path + ": read error");
    return bytes;
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, const std::string& format) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(format + ": " + path + ": cannot open for writing");
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw IoError(format + ": " + path + ": write error");
}

}  // namespace attn::io_detail
