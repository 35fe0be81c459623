// Source mutants for `attn mutate`: a lexer that sees only code, and the mutation operators on its tokens.
#include "mutate.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

namespace attn::cli::mutate {

namespace {

enum class Kind { identifier, number, punctuator, literal };  // literal: a string or character literal

struct Token {
    Kind kind;
    std::size_t begin, end;
    int line;
    bool space_before, space_after;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The punctuators, longest first so the first match is the longest one.
const char* const punctuators[] = {"<<=", ">>=", "->*", "<=>", "...", "::", "->", "++", "--", "<<", ">>", "<=", ">=",
                                   "==", "!=", "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*"};

// The code tokens of `text`; comments, preprocessor lines and the insides of literals are skipped.
std::vector<Token> tokenize(const std::string& text) {
    std::vector<Token> tokens;
    std::size_t i = 0;
    int line = 1;
    bool line_start = true;
    const std::size_t n = text.size();
    const auto push = [&](Kind kind, std::size_t begin, std::size_t end, int at_line) {
        const bool before = begin == 0 || is_space(text[begin - 1]);
        const bool after = end >= n || is_space(text[end]);
        tokens.push_back({kind, begin, end, at_line, before, after});
    };
    // A quoted literal from the opening quote at `i`; returns the index past its closing quote.
    const auto quoted = [&](std::size_t at, char quote) {
        std::size_t j = at + 1;
        while (j < n && text[j] != quote) {
            if (text[j] == '\\') ++j;
            if (j < n && text[j] == '\n') ++line;
            ++j;
        }
        return std::min(n, j + 1);
    };
    while (i < n) {
        const char c = text[i];
        if (c == '\n') {
            ++line;
            line_start = true;
            ++i;
            continue;
        }
        if (is_space(c)) {
            ++i;
            continue;
        }
        if (line_start && c == '#') {  // a preprocessor line, with its continuations
            while (i < n && text[i] != '\n') {
                if (text[i] == '\\' && i + 1 < n && text[i + 1] == '\n') {
                    ++line;
                    ++i;
                }
                ++i;
            }
            continue;
        }
        line_start = false;
        if (c == '/' && i + 1 < n && text[i + 1] == '/') {
            while (i < n && text[i] != '\n') ++i;
            continue;
        }
        if (c == '/' && i + 1 < n && text[i + 1] == '*') {
            std::size_t j = i + 2;
            while (j + 1 < n && !(text[j] == '*' && text[j + 1] == '/')) line += text[j++] == '\n';
            i = std::min(n, j + 2);
            continue;
        }
        const int at_line = line;
        if (c == '"' || c == '\'') {
            const std::size_t end = quoted(i, c);
            push(Kind::literal, i, end, at_line);
            i = end;
            continue;
        }
        if (is_ident_start(c)) {
            std::size_t j = i;
            while (j < n && is_ident_char(text[j])) ++j;
            const std::string word = text.substr(i, j - i);
            if (j < n && text[j] == '"' && (word == "R" || word == "u8R" || word == "LR" || word == "uR" || word == "UR")) {
                // A raw string: R"delim( ... )delim".
                const std::size_t open = text.find('(', j);
                const std::string close = ")" + text.substr(j + 1, open == std::string::npos ? 0 : open - j - 1) + "\"";
                const std::size_t end = open == std::string::npos ? n : text.find(close, open);
                const std::size_t stop = end == std::string::npos ? n : end + close.size();
                for (std::size_t k = i; k < stop; ++k) line += text[k] == '\n';
                push(Kind::literal, i, stop, at_line);
                i = stop;
                continue;
            }
            if (j < n && (text[j] == '"' || text[j] == '\'') && (word == "u8" || word == "u" || word == "U" || word == "L")) {
                const std::size_t end = quoted(j, text[j]);
                push(Kind::literal, i, end, at_line);
                i = end;
                continue;
            }
            push(Kind::identifier, i, j, at_line);
            i = j;
            continue;
        }
        if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && i + 1 < n && std::isdigit(static_cast<unsigned char>(text[i + 1])))) {
            std::size_t j = i + 1;
            while (j < n) {
                const char d = text[j];
                if (is_ident_char(d) || d == '.' || (d == '\'' && j + 1 < n && is_ident_char(text[j + 1]))) {
                    ++j;
                } else if ((d == '+' || d == '-') && (text[j - 1] == 'e' || text[j - 1] == 'E' || text[j - 1] == 'p' || text[j - 1] == 'P') &&
                           !(text[i] == '0' && i + 1 < n && (text[i + 1] == 'x' || text[i + 1] == 'X') && (text[j - 1] == 'e' || text[j - 1] == 'E'))) {
                    ++j;
                } else {
                    break;
                }
            }
            push(Kind::number, i, j, at_line);
            i = j;
            continue;
        }
        std::size_t len = 1;
        for (const char* p : punctuators) {
            const std::string s = p;
            if (text.compare(i, s.size(), s) == 0) {
                len = s.size();
                break;
            }
        }
        push(Kind::punctuator, i, i + len, at_line);
        i += len;
    }
    return tokens;
}

const std::set<std::string> statement_keywords = {
    "return", "break", "continue", "case", "default", "using", "typedef", "namespace", "template", "class", "struct",
    "enum", "public", "private", "protected", "goto", "static_assert", "if", "for", "while", "do", "switch", "try",
    "catch", "else", "const", "constexpr", "static", "auto", "inline", "extern", "friend", "virtual", "explicit",
    "unsigned", "signed", "int", "long", "short", "char", "bool", "double", "float", "void", "typename", "thread_local",
    "volatile", "mutable", "operator", "new", "delete", "sizeof", "decltype", "co_return", "co_await", "co_yield"};

const std::set<std::string> not_callees = {"if", "for", "while", "switch", "return", "sizeof", "catch", "decltype",
                                           "alignof", "noexcept", "static_assert", "alignas", "throw", "operator"};

struct Finder {
    const std::string& file;
    const std::string& text;
    std::vector<Token> tokens;
    std::vector<Mutant> out;
    std::vector<std::size_t> match;       // for brackets: the index of the matching one
    std::vector<std::size_t> statement;   // per token: the index of the first token of its statement
    std::vector<bool> statement_has_literal;
    std::vector<std::size_t> enclosing;   // per token: the innermost open bracket around it (n: none)

    Finder(const std::string& f, const std::string& t) : file(f), text(t), tokens(tokenize(t)) {
        const std::size_t n = tokens.size();
        match.assign(n, n);
        enclosing.assign(n, n);
        std::vector<std::size_t> stack;
        for (std::size_t k = 0; k < n; ++k) {
            const std::string s = str(k);
            if (!stack.empty()) enclosing[k] = stack.back();
            if (s == "(" || s == "[" || s == "{") stack.push_back(k);
            if ((s == ")" || s == "]" || s == "}") && !stack.empty()) {
                match[k] = stack.back();
                match[stack.back()] = k;
                stack.pop_back();
            }
        }
        // Statements, coarsely: runs of tokens between ';', '{' and '}'.
        statement.assign(n, 0);
        statement_has_literal.assign(n + 1, false);
        std::size_t start = 0;
        for (std::size_t k = 0; k < n; ++k) {
            statement[k] = start;
            if (tokens[k].kind == Kind::literal) statement_has_literal[start] = true;
            const std::string s = str(k);
            if (s == ";" || s == "{" || s == "}") start = k + 1;
        }
    }

    std::string str(std::size_t k) const { return text.substr(tokens[k].begin, tokens[k].end - tokens[k].begin); }
    bool is(std::size_t k, const char* s) const { return k < tokens.size() && str(k) == s; }
    bool spaced(std::size_t k) const { return tokens[k].space_before && tokens[k].space_after; }
    bool in_string_statement(std::size_t k) const { return statement_has_literal[statement[k]]; }

    void add(const std::string& op, std::size_t begin, std::size_t end, int line, const std::string& replacement) {
        Mutant m;
        m.file = file;
        m.offset = begin;
        m.length = end - begin;
        m.line = line;
        m.op = op;
        m.original = text.substr(begin, end - begin);
        m.replacement = replacement;
        // The id: the file, the operator, the trimmed source line and the change's column in it.
        const std::size_t line_begin = text.rfind('\n', begin == 0 ? 0 : begin - 1);
        const std::size_t from = line_begin == std::string::npos || begin == 0 ? 0 : line_begin + 1;
        const std::size_t line_end = std::min(text.find('\n', begin), text.size());
        std::size_t first = from;
        while (first < line_end && is_space(text[first])) ++first;
        const std::string line_text = text.substr(first, line_end - first);
        std::string key = file + "\n" + op + "\n" + line_text + "\n" + std::to_string(begin - first) + "\n" + replacement;
        // A line that occurs more than once in the file: its occurrence counts too.
        if (const int k = earlier_copies(from, line_text); k > 0) key += "\n#" + std::to_string(k);
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
        m.id = std::string(hex).substr(0, 10);
        out.push_back(m);
    }
    // How many lines before the one starting at `from` have the same trimmed text.
    int earlier_copies(std::size_t from, const std::string& line_text) const {
        int copies = 0;
        for (std::size_t at = 0; at < from;) {
            const std::size_t end = std::min(text.find('\n', at), text.size());
            std::size_t b = at, e = end;
            while (b < e && is_space(text[b])) ++b;
            while (e > b && is_space(text[e - 1])) --e;
            copies += text.compare(b, e - b, line_text) == 0;
            at = end + 1;
        }
        return copies;
    }
    void token(const std::string& op, std::size_t k, const std::string& replacement) {
        add(op, tokens[k].begin, tokens[k].end, tokens[k].line, replacement);
    }

    // A statement that may be deleted starts at token k: an assignment, a call, an increment or a throw.
    bool deletable_statement(std::size_t k) const {
        const std::string first = str(k);
        if (first == "throw" || first == "++" || first == "--") return true;
        if (tokens[k].kind != Kind::identifier || statement_keywords.count(first)) return false;
        std::size_t j = k + 1;  // past the chain a::b.c->d[i]
        while (j < tokens.size()) {
            if ((is(j, "::") || is(j, ".") || is(j, "->")) && j + 1 < tokens.size() && tokens[j + 1].kind == Kind::identifier) {
                j += 2;
            } else if (is(j, "[") && match[j] < tokens.size()) {
                j = match[j] + 1;
            } else {
                break;
            }
        }
        if (j >= tokens.size()) return false;
        const std::string next = str(j);
        if (next == "(") {  // a call: the statement must end right after it, or continue with a member call
            return true;
        }
        return next == "=" || next == "+=" || next == "-=" || next == "*=" || next == "/=" || next == "|=" ||
               next == "&=" || next == "++" || next == "--";
    }

    void find() {
        const std::size_t n = tokens.size();
        for (std::size_t k = 0; k < n; ++k) {
            const Token& t = tokens[k];
            const std::string s = str(k);
            // Relational operators: the boundary moved, or the comparison negated.
            static const std::map<std::string, std::string> relational = {
                {"<", "<="}, {"<=", "<"}, {">", ">="}, {">=", ">"}, {"==", "!="}, {"!=", "=="}};
            static const std::map<std::string, std::string> logical = {{"&&", "||"}, {"||", "&&"}};
            static const std::map<std::string, std::string> arithmetic = {
                {"+", "-"}, {"-", "+"}, {"*", "/"}, {"/", "*"}, {"+=", "-="}, {"-=", "+="}, {"*=", "/="}, {"/=", "*="}};
            if (t.kind == Kind::punctuator && spaced(k)) {
                if (auto it = relational.find(s); it != relational.end()) token("relational", k, it->second);
                if (auto it = logical.find(s); it != logical.end()) token("logical", k, it->second);
                if (auto it = arithmetic.find(s); it != arithmetic.end() && !(s[0] == '+' && in_string_statement(k)))
                    token("arithmetic", k, it->second);
            }
            if (t.kind == Kind::number) constant(k);
            if (t.kind == Kind::identifier && (s == "min" || s == "max" || s == "fmin" || s == "fmax") && k > 0 && is(k - 1, "::") &&
                is(k + 1, "("))
                token("min-max", k, s == "min" ? "max" : s == "max" ? "min" : s == "fmin" ? "fmax" : "fmin");
            if (t.kind == Kind::identifier && (s == "if" || s == "while") && is(k + 1, "(") && match[k + 1] < n) {
                const std::size_t open = k + 1, close = match[k + 1];
                const std::size_t b = tokens[open].end, e = tokens[close].begin;
                add("negate", b, e, tokens[open].line, "!(" + text.substr(b, e - b) + ")");
            }
            if (s == "(" && k > 0 && tokens[k - 1].kind == Kind::identifier && !not_callees.count(str(k - 1)) &&
                str(k - 1) != "min" && str(k - 1) != "max" && match[k] < n)
                swaps(k);
            // Statements: after ';', '{', '}', 'else' or the ')' closing an if/for/while header.
            const bool after_statement = k > 0 && is(k - 1, ";") && !(enclosing[k - 1] < n && is(enclosing[k - 1], "("));
            const bool starts = k == 0 || after_statement || is(k - 1, "{") || is(k - 1, "}") || is(k - 1, "else") ||
                                (is(k - 1, ")") && match[k - 1] < n && match[k - 1] > 0 &&
                                 (is(match[k - 1] - 1, "if") || is(match[k - 1] - 1, "for") || is(match[k - 1] - 1, "while")));
            if (starts && deletable_statement(k)) {
                std::size_t j = k;
                bool ok = false;
                while (j < n) {
                    const std::string u = str(j);
                    if (u == ";") {
                        ok = true;
                        break;
                    }
                    if (u == "{" || u == "}") break;  // a brace outside brackets: not a simple statement
                    if ((u == "(" || u == "[") && match[j] < n) j = match[j];
                    ++j;
                }
                if (ok) add("delete", t.begin, tokens[j].end, t.line, "{}");
            }
        }
    }

    // Adjacent arguments of a call that are plain names (a, a.b, a::b) swapped.
    void swaps(std::size_t open) {
        const std::size_t close = match[open];
        std::vector<std::pair<std::size_t, std::size_t>> args;  // [first, last] token indices
        std::size_t first = open + 1;
        for (std::size_t j = open + 1; j <= close; ++j) {
            if (j < close && (is(j, "(") || is(j, "[") || is(j, "{")) && match[j] < tokens.size()) {
                j = match[j];
                continue;
            }
            if (j == close || is(j, ",")) {
                if (j > first) args.emplace_back(first, j - 1);
                first = j + 1;
            }
        }
        const auto simple = [&](std::pair<std::size_t, std::size_t> a) {
            bool name = false;
            for (std::size_t j = a.first; j <= a.second; ++j) {
                const Token& t = tokens[j];
                if (t.kind == Kind::identifier) name = true;
                else if (!(is(j, "::") || is(j, ".") || is(j, "->"))) return false;
                if (j > a.first && t.space_before) return false;
            }
            return name;
        };
        for (std::size_t a = 0; a + 1 < args.size(); ++a) {
            if (!simple(args[a]) || !simple(args[a + 1])) continue;
            const std::size_t b = tokens[args[a].first].begin, e = tokens[args[a + 1].second].end;
            const std::string x = text.substr(b, tokens[args[a].second].end - b);
            const std::string y = text.substr(tokens[args[a + 1].first].begin, e - tokens[args[a + 1].first].begin);
            if (x == y) continue;
            const std::string between = text.substr(tokens[args[a].second].end, tokens[args[a + 1].first].begin - tokens[args[a].second].end);
            add("swap-arguments", b, e, tokens[args[a].first].line, y + between + x);
        }
    }

    // A number literal changed: 0 -> 1, 1 -> 0, other integers n -> n + 1; a floating zero -> 1, other floating
    // constants doubled.
    void constant(std::size_t k) {
        const std::string s = str(k);
        if (s.size() > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X' || s[1] == 'b' || s[1] == 'B')) return;
        std::size_t digits = 0;
        while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '\'')) ++digits;
        const bool floating = s.find_first_of(".eE") != std::string::npos;
        if (!floating) {
            std::string value;
            for (std::size_t j = 0; j < digits; ++j)
                if (s[j] != '\'') value += s[j];
            if (value.empty() || value.size() > 18) return;
            const unsigned long long v = std::stoull(value);
            const unsigned long long w = v == 0 ? 1 : v == 1 ? 0 : v + 1;
            token("constant", k, std::to_string(w) + s.substr(digits));
            return;
        }
        std::size_t mantissa_end = s.find_first_of("eE");
        if (mantissa_end == std::string::npos) mantissa_end = s.find_first_not_of("0123456789.'");
        if (mantissa_end == std::string::npos) mantissa_end = s.size();
        const std::string mantissa = s.substr(0, mantissa_end);
        if (mantissa.find_first_not_of("0.'") == std::string::npos) {  // zero
            const std::size_t suffix = s.find_first_not_of("0123456789.'eE+-");
            token("constant", k, "1.0" + (suffix == std::string::npos ? std::string() : s.substr(suffix)));
            return;
        }
        token("constant", k, "(2 * " + s + ")");
    }
};

}  // namespace

const std::vector<Operator>& operators() {
    static const std::vector<Operator> ops = {
        {"relational", "a comparison's boundary moved or its sense negated: < <=, > >=, == !="},
        {"logical", "&& and || exchanged"},
        {"arithmetic", "+ and -, * and / exchanged (also in += -= *= /=); not in statements that build strings"},
        {"constant", "a number changed: 0 to 1, 1 to 0 (the +-1 of index arithmetic), n to n + 1, a float doubled"},
        {"min-max", "std::min and std::max (fmin, fmax) exchanged"},
        {"negate", "an if or while condition negated"},
        {"swap-arguments", "two adjacent arguments of a call that are plain names exchanged"},
        {"delete", "a statement (assignment, call, increment or throw) deleted"},
    };
    return ops;
}

std::vector<Mutant> find_mutants(const std::string& file, const std::string& text) {
    Finder f(file, text);
    f.find();
    std::stable_sort(f.out.begin(), f.out.end(), [](const Mutant& a, const Mutant& b) { return a.offset < b.offset; });
    return f.out;
}

std::string apply(const std::string& text, const Mutant& m) {
    std::string s = text;
    s.replace(m.offset, m.length, m.replacement);
    return s;
}

std::string describe(const Mutant& m) {
    const auto shorten = [](std::string s) {
        for (char& c : s)
            if (c == '\n' || c == '\t') c = ' ';
        std::string t;
        for (char c : s)
            if (!(c == ' ' && !t.empty() && t.back() == ' ')) t += c;
        return t.size() > 70 ? t.substr(0, 67) + "..." : t;
    };
    return "line " + std::to_string(m.line) + ": `" + shorten(m.original) + "` -> `" + shorten(m.replacement) + "`";
}

std::vector<Mutant> sample(const std::vector<Mutant>& all, std::size_t total, std::size_t min_per_file) {
    std::map<std::string, std::vector<Mutant>> by_file;
    for (const Mutant& m : all) by_file[m.file].push_back(m);
    for (auto& [file, ms] : by_file)
        std::sort(ms.begin(), ms.end(), [](const Mutant& a, const Mutant& b) { return a.id < b.id; });
    std::map<std::string, std::size_t> quota;
    std::size_t given = 0;
    for (auto& [file, ms] : by_file) given += quota[file] = std::min(ms.size(), min_per_file);
    // The rest one at a time to the file with the most mutants per mutant taken (D'Hondt's rule: a larger sample
    // contains every smaller one).
    while (given < total) {
        const std::string* best = nullptr;
        double best_ratio = 0;
        for (auto& [file, ms] : by_file) {
            if (quota[file] >= ms.size()) continue;
            const double r = static_cast<double>(ms.size()) / static_cast<double>(quota[file] + 1);
            if (best == nullptr || r > best_ratio) best = &file, best_ratio = r;
        }
        if (best == nullptr) break;
        ++quota[*best];
        ++given;
    }
    std::vector<Mutant> out;
    for (auto& [file, ms] : by_file) {
        std::vector<Mutant> taken(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(std::min(quota[file], ms.size())));
        std::sort(taken.begin(), taken.end(), [](const Mutant& a, const Mutant& b) { return a.offset < b.offset; });
        out.insert(out.end(), taken.begin(), taken.end());
    }
    return out;
}

std::uint64_t fnv1a(const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

}  // namespace attn::cli::mutate
