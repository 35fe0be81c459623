#!/usr/bin/python3
"""Runs every code block of one Markdown document the way a reader would, from a scratch directory outside the
checkout (ctest label `docs`, one test per document).

Every fenced block needs an info string; it decides what happens to the block:
  python   run with this interpreter (Debian's /usr/bin/python3, its numpy and torch), in the scratch directory;
           `import attn` finds the module of --build-dir (PYTHONPATH=<build-dir>/python, as a reader sets it)
  sh       run with bash -e in the scratch directory; `./attn` means the launcher of this checkout, by path
  cpp      a complete program: compiled against attn installed into a scratch prefix (find_package(attn)), then run
  text     a listing, a layout or an output: shown, never run (json blocks are parsed: they must be JSON)
A python, sh or cpp block that must not run says why on the line before its fence:
  <!-- docs: not run: <reason> -->
The blocks of a document run in order in one directory, so a block can read what an earlier one wrote. A block
passes when it exits 0. --list prints each block and what is done with it, without running anything.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

RUN = ("python", "sh", "cpp")
SHOWN = ("text", "json")
MARKER = re.compile(r"^\s*<!--\s*docs:\s*not run:\s*(.+?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(.*)$")


class Block:
    def __init__(self, line, lang, body, not_run):
        self.line, self.lang, self.body, self.not_run = line, lang, body, not_run


def parse(path):
    """The fenced blocks of a Markdown file, with the line of their opening fence; errors for malformed fences."""
    blocks, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).strip()
        start = i + 1
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            errors.append(f"{path}:{start}: the block opened here is never closed")
            break
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j]) + "\n"
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.match(lines[k]) if k >= 0 else None
        if not lang:
            errors.append(f"{path}:{start}: the block has no info string; say what it is "
                          f"({', '.join(RUN + SHOWN)})")
        elif lang not in RUN + SHOWN:
            errors.append(f"{path}:{start}: unknown info string '{lang}' (one of {', '.join(RUN + SHOWN)})")
        elif marker and lang not in RUN:
            errors.append(f"{path}:{start}: a '{lang}' block is never run; the 'not run' marker is for "
                          f"{', '.join(RUN)} blocks")
        blocks.append(Block(start, lang, body, marker.group(1) if marker else None))
        i = j + 1
    return blocks, errors


def describe(block):
    if block.lang in RUN:
        return f"not run: {block.not_run}" if block.not_run else "run"
    return "parsed as JSON" if block.lang == "json" else "shown only"


def run(cmd, cwd, env=None):
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout, time.monotonic() - t0


def build_cpp(blocks, args, work):
    """Installs attn into a scratch prefix and builds each cpp block as its own program with find_package(attn)."""
    project = os.path.join(work, "cpp")
    os.makedirs(project, exist_ok=True)
    prefix = os.path.join(work, "prefix")
    code, out, _ = run(["cmake", "--install", args.build_dir, "--prefix", prefix], cwd=work)
    if code != 0:
        return f"cmake --install {args.build_dir} failed:\n{out}"
    lists = ["cmake_minimum_required(VERSION 3.25)", "project(attn_docs_examples LANGUAGES CXX)",
             "find_package(attn REQUIRED)"]
    for b in blocks:
        name = f"example_line{b.line}"
        with open(os.path.join(project, name + ".cpp"), "w", encoding="utf-8") as f:
            f.write(b.body)
        lists += [f"add_executable({name} {name}.cpp)", f"target_link_libraries({name} PRIVATE attn::attn)",
                  f"target_compile_features({name} PRIVATE cxx_std_20)"]
    with open(os.path.join(project, "CMakeLists.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lists) + "\n")
    configure = ["cmake", "-S", project, "-B", os.path.join(project, "build"), "-G", "Ninja",
                 f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_CXX_COMPILER={args.cxx}", "-DCMAKE_BUILD_TYPE=Release"]
    for cmd in (configure, ["cmake", "--build", os.path.join(project, "build")]):
        code, out, _ = run(cmd, cwd=work)
        if code != 0:
            return f"{' '.join(cmd)} failed:\n{out}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("document")
    parser.add_argument("--root", required=True, help="the checkout (its ./attn is the launcher)")
    parser.add_argument("--build-dir", help="the build to install for cpp blocks")
    parser.add_argument("--cxx", default="c++", help="the compiler for cpp blocks")
    parser.add_argument("--cpp-work", help="where cpp blocks are built (an exec-mounted directory)")
    parser.add_argument("--list", action="store_true", help="print each block and what is done with it")
    args = parser.parse_args()

    doc = os.path.relpath(os.path.abspath(args.document), args.root)
    blocks, errors = parse(args.document)
    for e in errors:
        print(e)
    if args.list:
        for b in blocks:
            print(f"{doc}:{b.line}\t{b.lang or '-'}\t{describe(b)}\t{b.body.strip().splitlines()[0][:70]}")
    if errors or args.list:
        return 1 if errors else 0

    launcher = os.path.join(os.path.abspath(args.root), "attn")
    scratch = tempfile.mkdtemp(prefix="attn-docs-")
    cpp_work = None
    failures = 0
    try:
        cpp = [b for b in blocks if b.lang == "cpp" and not b.not_run]
        cpp_error = None
        if cpp:
            if not args.build_dir:
                print(f"{doc}: has cpp blocks but no --build-dir to install from")
                return 1
            cpp_work = tempfile.mkdtemp(prefix="attn-docs-cpp-", dir=args.cpp_work)
            cpp_error = build_cpp(cpp, args, cpp_work)
        for b in blocks:
            where = f"{doc}:{b.line} ({b.lang})"
            if b.lang == "json":
                try:
                    json.loads(b.body)
                    print(f"{where}: parsed as JSON")
                except json.JSONDecodeError as e:
                    print(f"{where}: FAILED: not JSON ({e}); a block that is not JSON is 'text'")
                    failures += 1
                continue
            if b.lang not in RUN or b.not_run:
                print(f"{where}: {describe(b)}")
                continue
            if b.lang == "python":
                path = os.path.join(scratch, f"block_line{b.line}.py")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(b.body)
                cmd = [sys.executable, path]
                env = dict(os.environ)
                if args.build_dir:
                    env["PYTHONPATH"] = os.path.join(os.path.abspath(args.build_dir), "python")
            elif b.lang == "sh":
                body = re.sub(r"(?<![\w./-])\./attn(?=\s|$)", launcher.replace("\\", "\\\\"), b.body)
                cmd = ["bash", "-e", "-o", "pipefail", "-c", body]
            else:
                if cpp_error:
                    print(f"{where}: FAILED to build:\n{cpp_error}")
                    failures += 1
                    continue
                cmd = [os.path.join(cpp_work, "cpp", "build", f"example_line{b.line}")]
            code, out, seconds = run(cmd, cwd=scratch, env=env if b.lang == "python" else None)
            status = "ran" if code == 0 else f"FAILED with exit code {code}"
            print(f"{where}: {status} ({seconds:.1f} s) in {scratch}")
            if out.strip():
                print("    " + out.rstrip().replace("\n", "\n    "))
            if code != 0:
                failures += 1
    finally:
        if failures == 0:
            shutil.rmtree(scratch, ignore_errors=True)
            if cpp_work:
                shutil.rmtree(cpp_work, ignore_errors=True)
        else:
            print(f"the scratch directory is kept: {scratch}")
    ran = sum(1 for b in blocks if b.lang in RUN and not b.not_run)
    print(f"{doc}: {len(blocks)} blocks, {ran} run, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
