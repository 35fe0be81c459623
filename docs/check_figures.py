#!/usr/bin/python3
"""The README's figures are bench/current.md's, and each of those is what its run printed (ctest docs_check_figures).

bench/current.md holds the one table of current speed and memory figures, between `<!-- figures: begin -->` and
`<!-- figures: end -->`; the README shows the same block. This check fails when
  - the README's block differs from bench/current.md's (or either has none);
  - a row's run file (bench/results/<run>) is missing, does not record the row's fingerprint, or has no target
    line `<target>  <figure> (goal <goal>) <verdict>` exactly as `attn bench` prints it;
  - the README states a speed or memory figure (a percentage, an `N.NNx` ratio, ms, MiB, GFLOP/s) outside the block:
    every such number belongs to the table.
"""
import argparse
import re
import sys

BEGIN, END = "<!-- figures: begin -->", "<!-- figures: end -->"
# A speed or memory figure in prose: 84.7%, 1.95x, 118 ms, 19 MiB, 92.5 GFLOP/s.
FIGURE = re.compile(r"\b\d+(\.\d+)?(x\b|\s?(%|ms\b|MiB\b|GiB\b|GFLOP))")


def block(path):
    text = open(path, encoding="utf-8").read()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"{path}: needs exactly one '{BEGIN}' ... '{END}' block")
    start, end = text.index(BEGIN), text.index(END)
    return text[start:end + len(END)], text[:start] + text[end + len(END):]


def rows(table):
    out = []
    for line in table.split("\n"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0].startswith("target") or set(cells[0]) <= set("-: "):
            continue
        target, figure, goal, verdict, run, fingerprint = cells
        out.append((target, figure, goal, verdict, run.strip("`"), fingerprint.strip("`")))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    root = ap.parse_args().root
    errors = []
    current, _ = block(f"{root}/bench/current.md")
    shown, prose = block(f"{root}/README.md")
    if shown != current:
        errors.append("README.md's figures block differs from bench/current.md's: copy the block over")
    table = rows(current)
    if not table:
        errors.append("bench/current.md: the figures block has no rows")
    for target, figure, goal, verdict, run, fingerprint in table:
        path = f"{root}/bench/results/{run}"
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            errors.append(f"row '{target}': {e}")
            continue
        if f"attn_fingerprint: {fingerprint}" not in text:
            errors.append(f"row '{target}': {run} records no fingerprint {fingerprint}")
        line = re.compile(r"^\s*" + re.escape(target) + r"\s+" + re.escape(figure) + r" \(goal " + re.escape(goal) +
                          r"\) " + re.escape(verdict) + r"\s*$", re.M)
        if not line.search(text):
            errors.append(f"row '{target}': {run} has no target line '{figure} (goal {goal}) {verdict}'")
    fenced = False
    for l in prose.split("\n"):
        if l.lstrip().startswith("```"):
            fenced = not fenced  # code blocks hold commands and programs, not figures
            continue
        if FIGURE.search(l) and not fenced:
            errors.append(f"README.md: a figure outside the figures block (it belongs in bench/current.md): {l.strip()}")
    for e in errors:
        print("check_figures:", e)
    print(f"check_figures: {len(table)} rows, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
