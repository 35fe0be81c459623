// Markdown and HTML renderings of the report document.
#include "document.hpp"

#include <cctype>
#include <fstream>
#include <sstream>

namespace attn::report {

namespace {

std::string md_cell(const std::string& s) {
    std::string r;
    for (char ch : s) {
        if (ch == '|') r += "\\|";
        else if (ch == '\n') r += ' ';
        else r += ch;
    }
    return r;
}

std::string html_escape(const std::string& s) {
    std::string r;
    for (char ch : s) {
        switch (ch) {
            case '&': r += "&amp;"; break;
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '"': r += "&quot;"; break;
            default: r += ch;
        }
    }
    return r;
}

// `code` and **bold** to HTML, everything else escaped.
std::string html_inline(const std::string& s) {
    std::string r;
    bool in_code = false, in_bold = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '`') {
            r += in_code ? "</code>" : "<code>";
            in_code = !in_code;
        } else if (!in_code && s.compare(i, 2, "**") == 0) {
            r += in_bold ? "</b>" : "<b>";
            in_bold = !in_bold;
            ++i;
        } else {
            r += html_escape(std::string(1, s[i]));
        }
    }
    if (in_code) r += "</code>";
    if (in_bold) r += "</b>";
    return r;
}

void md_table(std::ostringstream& o, const Table& t) {
    o << "|";
    for (const auto& h : t.header) o << " " << md_cell(h) << " |";
    o << "\n|";
    for (std::size_t i = 0; i < t.header.size(); ++i) o << "---|";
    o << "\n";
    for (const auto& row : t.rows) {
        o << "|";
        for (const auto& cell : row) o << " " << md_cell(cell) << " |";
        o << "\n";
    }
}

void html_table(std::ostringstream& o, const Table& t) {
    o << "<table>\n<thead><tr>";
    for (const auto& h : t.header) o << "<th>" << html_inline(h) << "</th>";
    o << "</tr></thead>\n<tbody>\n";
    for (const auto& row : t.rows) {
        o << "<tr>";
        for (const auto& cell : row) o << "<td>" << html_inline(cell) << "</td>";
        o << "</tr>\n";
    }
    o << "</tbody>\n</table>\n";
}

std::string anchor(const std::string& title) {
    std::string r;
    for (char ch : title) {
        if (std::isalnum(static_cast<unsigned char>(ch))) r += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        else if (ch == ' ' || ch == '-') r += '-';
    }
    return r;
}

}  // namespace

std::string render_markdown(const Document& doc) {
    std::ostringstream o;
    o << "# " << doc.title << "\n\n";
    for (const Section& s : doc.sections) {
        o << "## " << s.title << "\n\n";
        for (const Block& b : s.blocks) {
            switch (b.kind) {
                case Block::Kind::Paragraph: o << b.text << "\n\n"; break;
                case Block::Kind::Code: o << "```\n" << b.text << "\n```\n\n"; break;
                case Block::Kind::Plot: o << "![" << b.text << "](" << b.plot_path << ")\n\n"; break;
                case Block::Kind::Table:
                    if (!b.summary.empty()) o << "<details><summary>" << html_escape(b.summary) << "</summary>\n\n";
                    md_table(o, b.table);
                    o << "\n";
                    if (!b.summary.empty()) o << "</details>\n\n";
                    break;
            }
        }
    }
    return o.str();
}

std::string render_html(const Document& doc, const std::string& report_dir) {
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << html_escape(doc.title)
      << "</title>\n<style>\n"
      << "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}\n"
      << "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.85em}\n"
      << "th,td{border:1px solid #ccc;padding:0.2em 0.5em;text-align:left;vertical-align:top}\n"
      << "th{background:#f0f0f0} tr:nth-child(even){background:#fafafa}\n"
      << "code{font-size:0.95em;background:#f4f4f4;padding:0 0.2em}\n"
      << "pre{background:#f4f4f4;padding:0.6em;overflow-x:auto}\n"
      << ".plot{margin:1em 0} .plot object{width:100%;aspect-ratio:3/1}\n"
      << "nav a{margin-right:1em}\n</style>\n</head>\n<body>\n";
    o << "<h1>" << html_escape(doc.title) << "</h1>\n<nav>";
    for (const Section& s : doc.sections) o << "<a href=\"#" << anchor(s.title) << "\">" << html_escape(s.title) << "</a>";
    o << "</nav>\n";
    for (const Section& s : doc.sections) {
        o << "<h2 id=\"" << anchor(s.title) << "\">" << html_escape(s.title) << "</h2>\n";
        for (const Block& b : s.blocks) {
            switch (b.kind) {
                case Block::Kind::Paragraph: o << "<p>" << html_inline(b.text) << "</p>\n"; break;
                case Block::Kind::Code: o << "<pre>" << html_escape(b.text) << "</pre>\n"; break;
                case Block::Kind::Plot: {
                    // Linked, not inlined: the page stays small (the plots are most of the report's bytes) and an
                    // <object> keeps the SVG's hover titles, which an <img> would drop.
                    std::ifstream in(report_dir + "/" + b.plot_path);
                    std::string head(256, '\0');
                    in.read(head.data(), static_cast<std::streamsize>(head.size()));
                    if (head.find("<svg") == std::string::npos) {
                        o << "<p>(plot " << html_escape(b.plot_path) << " missing)</p>\n";
                    } else {
                        o << "<div class=\"plot\" title=\"" << html_escape(b.text) << "\"><object data=\""
                          << html_escape(b.plot_path) << "\" type=\"image/svg+xml\">" << html_escape(b.text)
                          << "</object></div>\n";
                    }
                    break;
                }
                case Block::Kind::Table:
                    if (!b.summary.empty()) o << "<details><summary>" << html_inline(b.summary) << "</summary>\n";
                    html_table(o, b.table);
                    if (!b.summary.empty()) o << "</details>\n";
                    break;
            }
        }
    }
    o << "</body>\n</html>\n";
    return o.str();
}

}  // namespace attn::report
