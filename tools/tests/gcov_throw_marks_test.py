#!/usr/bin/env python3
"""tools/workshop/gcov_throw_marks.py under gcovr, on a program with a template instance that never runs.

A template whose one line both tests and throws (its message built with string calls, each with an exception
edge) is instantiated twice, with the same code in both (gcovr merges a line's branches across instances by their
number in gcov's text, which counts calls too), and only one instance runs. gcovr --exclude-throw-branches through the wrapper must
count exactly the branches gcov's JSON output gives when its exception edges are left out (merged per line
across instances, as gcovr merges them), with the same covered count as gcovr without the wrapper, and fewer
branches in all than without it (the exception edges of the instance that never ran).
Usage: gcov_throw_marks_test.py (exit 0 pass, 1 fail, 77 skipped without g++ or gcovr).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WRAPPER = os.path.join(HERE, "..", "workshop", "gcov_throw_marks.py")
PROGRAM = r"""
#include <stdexcept>
#include <string>
template <class T>
T checked(T x, const std::string& name) {
    if (x < T(0)) throw std::invalid_argument(name + " is negative (" + name + ", " + name + ")");
    return x;
}
int main(int argc, char**) {
    int r = checked<int>(argc, "argc");
    if (argc > 100) r += static_cast<int>(checked<double>(argc, "argc"));  // never runs
    return r > 0 ? 0 : 1;
}
"""


def gcovr_summary(work, wrapped):
    out = os.path.join(work, "wrapped.json" if wrapped else "plain.json")
    command = ["gcovr", "--root", work, "--exclude-throw-branches", "--json-summary", out]
    if wrapped:
        command += ["--gcov-executable", sys.executable + " " + WRAPPER]
    subprocess.run(command + [work], cwd=work, check=True, capture_output=True, text=True)
    with open(out) as fh:
        data = json.load(fh)
    return data["branch_covered"], data["branch_total"]


def json_counts(work):
    """(covered, total) of t.cpp's branches from gcov's JSON, exception edges left out, merged per line by position."""
    gcda = [f for f in os.listdir(work) if f.endswith(".gcda")][0]
    out = subprocess.run(["gcov", "-b", "-c", "--json-format", "--stdout", gcda], cwd=work, check=True,
                         capture_output=True, text=True).stdout
    per_line = {}
    for document in out.splitlines():
        for f in json.loads(document)["files"]:
            if not f["file"].endswith("t.cpp"):
                continue
            for line in f["lines"]:
                merged = per_line.setdefault(line["line_number"], {})
                for k, b in enumerate(line.get("branches", [])):
                    if not b["throw"]:
                        merged[k] = merged.get(k, 0) + b["count"]
    total = sum(len(m) for m in per_line.values())
    covered = sum(1 for m in per_line.values() for c in m.values() if c > 0)
    return covered, total


def main():
    if not shutil.which("g++") or not shutil.which("gcovr") or not shutil.which("gcov"):
        print("skipped: g++, gcov or gcovr missing")
        return 77
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "t.cpp"), "w") as fh:
            fh.write(PROGRAM)
        subprocess.run(["g++", "--coverage", "-O0", "-o", "t", "t.cpp"], cwd=work, check=True)
        subprocess.run([os.path.join(work, "t")], cwd=work, check=True)
        plain = gcovr_summary(work, wrapped=False)
        wrapped = gcovr_summary(work, wrapped=True)
        expected = json_counts(work)
    print(f"gcovr: {plain[0]}/{plain[1]}; through the wrapper: {wrapped[0]}/{wrapped[1]}; gcov JSON: {expected[0]}/{expected[1]}")
    failures = []
    if wrapped != expected:
        failures.append(f"through the wrapper gcovr counts {wrapped}, gcov's JSON without exception edges {expected}")
    if wrapped[0] != plain[0]:
        failures.append(f"the wrapper changed the covered count: {plain[0]} -> {wrapped[0]}")
    if not wrapped[1] < plain[1]:
        failures.append(f"the never-run instance's exception edges were not left out: total {plain[1]} -> {wrapped[1]}")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
