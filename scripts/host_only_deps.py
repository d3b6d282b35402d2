#!/usr/bin/env python3
"""Lists the dependencies that only run at build time (procedural macros, build scripts and what
they use), which Cargo.toml's `[profile.dev.package]` builds without optimisation.

A package is build-time only when it is in the graph with build-dependency and proc-macro edges but
not in the graph of normal and dev dependencies without proc-macro edges (`cargo tree -e
no-proc-macro`), for this machine's target. `--check` compares with Cargo.toml: a listed package
that also runs in the product or its tests fails the check (it would run unoptimised); a build-time
package not listed is only reported (it builds slower, never wrongly).

Usage: scripts/host_only_deps.py [--check]
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def tree(edges):
    target = subprocess.run(
        ["rustc", "-vV"], capture_output=True, text=True, check=True
    ).stdout
    host = re.search(r"^host: (\S+)", target, re.M).group(1)
    out = subprocess.run(
        ["cargo", "tree", "--workspace", "-e", edges, "--target", host, "--prefix", "none"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def workspace_packages():
    names = set()
    for manifest in ROOT.glob("**/Cargo.toml"):
        if "target" in manifest.parts or manifest.parent == ROOT:
            continue
        m = re.search(r'^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M)
        if m:
            names.add(m.group(1))
    return names


def listed():
    text = (ROOT / "Cargo.toml").read_text()
    # The table's lines up to the next header, blank lines and comments included.
    m = re.search(r"^\[profile\.dev\.package\]\n((?:(?!\[).*\n?)*)", text, re.M)
    if not m:
        return set()
    return {
        line.split("=")[0].strip().strip('"')
        for line in m.group(1).splitlines()
        if re.search(r"opt-level\s*=\s*0\b", line)
    }


def main():
    every = tree("normal,build,dev")
    runtime = tree("normal,dev,no-proc-macro")
    build_only = sorted(every - runtime - workspace_packages())
    if "--check" not in sys.argv[1:]:
        print("\n".join(build_only))
        return 0
    have = listed()
    wrong = sorted(have & runtime)
    missing = sorted(set(build_only) - have)
    if missing:
        print("build-time dependencies Cargo.toml could leave unoptimised:", ", ".join(missing))
    if wrong:
        print(
            "Cargo.toml's [profile.dev.package] leaves unoptimised what the product or its tests "
            "run:",
            ", ".join(wrong),
        )
        return 1
    print(f"{len(have)} build-time dependencies unoptimised, none of them run by the product")
    return 0


if __name__ == "__main__":
    sys.exit(main())
