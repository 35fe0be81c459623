// fuzz/replay_main.cpp: a main for the fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput on every file
// named on the command line (directories are walked, sorted, skipping *.note files), so ctest replays the corpora
// and regressions with any compiler. A property violation aborts, as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::filesystem::path> inputs_under(const std::filesystem::path& path) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
        for (const auto& entry : std::filesystem::recursive_directory_iterator(path))
            if (entry.is_regular_file() && entry.path().extension() != ".note" && entry.path().filename() != "README.md")
                files.push_back(entry.path());
        std::sort(files.begin(), files.end());
    } else if (std::filesystem::exists(path)) {
        files.push_back(path);
    }
    return files;
}

}  // namespace

int main(int argc, char** argv) {
    // --min-inputs=N: fail when fewer than N files were replayed (a replay of nothing must not pass).
    std::size_t min_inputs = 0, replayed = 0;
    for (int a = 1; a < argc; ++a) {
        const std::string arg = argv[a];
        if (arg.rfind("--min-inputs=", 0) == 0) {
            min_inputs = std::stoul(arg.substr(13));
            continue;
        }
        if (!std::filesystem::exists(arg)) {
            std::printf("replay: %s does not exist, skipped\n", arg.c_str());
            continue;
        }
        for (const auto& file : inputs_under(arg)) {
            std::ifstream in(file, std::ios::binary);
            const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            std::printf("replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
            std::fflush(stdout);
            LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
            ++replayed;
        }
    }
    std::printf("replay: %zu inputs, no property violated\n", replayed);
    if (replayed < min_inputs) {
        std::printf("replay: expected at least %zu inputs\n", min_inputs);
        return 1;
    }
    return 0;
}
