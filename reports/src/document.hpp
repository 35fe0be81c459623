// reports/src/document.hpp: a small document model rendered both as Markdown (accuracy.md) and as one HTML page
// (index.html), so the two always say the same thing.
#pragma once

#include <string>
#include <vector>

namespace attn::report {

struct Table {
    std::vector<std::string> header;
    std::vector<std::vector<std::string>> rows;
};

// Paragraph text may use `code` and **bold**; both renderers understand these two and nothing else.
struct Block {
    enum class Kind { Paragraph, Table, Plot, Code } kind = Kind::Paragraph;
    std::string text;        // Paragraph and Code text; Plot: alt text
    Table table;             // Table
    std::string summary;     // Table: when non-empty, the table is collapsed under this line
    std::string plot_path;   // Plot: path relative to the report directory (plots/x.svg)
};

struct Section {
    std::string title;
    std::vector<Block> blocks;
    void paragraph(std::string text) { blocks.push_back({Block::Kind::Paragraph, std::move(text), {}, {}, {}}); }
    void code(std::string text) { blocks.push_back({Block::Kind::Code, std::move(text), {}, {}, {}}); }
    void table(Table t, std::string collapsed_summary = {}) {
        blocks.push_back({Block::Kind::Table, {}, std::move(t), std::move(collapsed_summary), {}});
    }
    void plot(std::string path, std::string alt) { blocks.push_back({Block::Kind::Plot, std::move(alt), {}, {}, std::move(path)}); }
};

struct Document {
    std::string title;
    std::vector<Section> sections;
};

std::string render_markdown(const Document& doc);
// Plots are inlined (the SVG text read from report_dir/plot_path), so the page is one self-contained file.
std::string render_html(const Document& doc, const std::string& report_dir);

}  // namespace attn::report
