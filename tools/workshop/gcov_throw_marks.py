#!/usr/bin/env python3
"""gcov as gcovr 5.2 runs it, with every exception edge marked `(throw)` in the text it parses.

gcovr 5.2 reads gcov's text output. There a branch whose block never ran is printed "never executed", without
the `(throw)` mark an executed exception edge gets, so `gcovr --exclude-throw-branches` drops the exception edges
of the template instances a run entered and keeps those of the instances it never entered (merged by branch
number, they count as missed branches of the line). gcov's JSON output marks every exception edge, run or not.

`attn coverage` passes this script as gcovr's `--gcov-executable`. It runs gcov with the arguments gcovr gave,
passes its output through, then reads gcov's JSON for the same data file and rewrites each "branch N never
executed" of the .gcov files gcov created as "branch N taken 0 (throw)" where the JSON marks that branch (the k-th
branch of that source line, in some instance of the function) an exception edge. Counts and every other line
are left as gcov wrote them. ATTN_GCOV names the gcov to run (default: gcov).
"""
import json
import os
import re
import subprocess
import sys

SOURCE_LINE = re.compile(r"^\s*[^:\s]+:\s*(\d+):")
NEVER = "never executed"


def throw_branches(gcov, data_file, object_dir):
    """{(source path, line): {k, ...}}: the positions k of the branches the JSON marks as exception edges."""
    command = [gcov, "--json-format", "--stdout", "--branch-counts", "--branch-probabilities", data_file]
    if object_dir:
        command += ["--object-directory", object_dir]
    out = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C")).stdout
    marks = {}
    for document in out.splitlines():
        if not document.strip():
            continue
        data = json.loads(document)
        cwd = data.get("current_working_directory", "")
        for f in data.get("files", []):
            path = os.path.realpath(os.path.join(cwd, f["file"]))
            for line in f.get("lines", []):
                for k, branch in enumerate(line.get("branches", [])):
                    if branch.get("throw"):
                        marks.setdefault((path, line["line_number"]), set()).add(k)
    return marks


def mark(gcov_file, marks):
    with open(gcov_file, encoding="utf-8", errors="surrogateescape") as fh:
        lines = fh.read().split("\n")
    source, line_number, k, changed = None, 0, 0, False
    for i, text in enumerate(lines):
        m = SOURCE_LINE.match(text)
        if m:
            number = int(m.group(1))
            if number == 0:
                if ":Source:" in text:
                    source = os.path.realpath(text.split(":Source:", 1)[1])
            else:
                line_number, k = number, 0  # a source line, in the file or in one instance's block
            continue
        if text.startswith("branch "):
            if text.endswith(NEVER) and k in marks.get((source, line_number), ()):
                lines[i] = text[: -len(NEVER)] + "taken 0 (throw)"
                changed = True
            k += 1
    if changed:
        with open(gcov_file, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write("\n".join(lines))


def main(args):
    gcov = os.environ.get("ATTN_GCOV", "gcov")
    run = subprocess.run([gcov] + args, capture_output=True, text=True)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode != 0 or not args or args[0].startswith("-"):
        return run.returncode  # --help, --version, or a failure: as gcov said
    created = re.findall(r"Creating '([^']+)'", run.stdout)
    if not created:
        return 0
    object_dir = args[args.index("--object-directory") + 1] if "--object-directory" in args else ""
    marks = throw_branches(gcov, args[0], object_dir)
    for name in created:
        mark(name, marks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
