#!/usr/bin/env python3
"""Reports cycles between the top-level modules of each crate in the workspace.

A top-level module `a` depends on `b` when code in `src/a.rs` (or under `src/a/`) names
`crate::b::…`, `crate::{b, …}`, `super::b` from `src/a.rs`, or an item that `lib.rs` re-exports from
`b` (`pub use b::Item`). Unit-test modules (`#[cfg(test)] mod tests`) are left out: a test may use
anything. Exits 1 and prints each cycle when one exists; `--graph` prints every edge.

Usage: scripts/module_cycles.py [--graph] [crate_dir ...]   (default: crates/*, bins/* and the tools/ crates)
"""

import pathlib
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def without_tests(text):
    # Other attributes may stand between `#[cfg(test)]` and the module (`#[allow(...)]`).
    m = re.search(
        r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*(pub(\(crate\))?\s+)?mod\s+" + IDENT + r"\s*\{",
        text,
    )
    return text[: m.start()] if m else text


def brace_group(text, start):
    """The text inside the braces opening at text[start] == '{'."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return text[start + 1 :]


def top_level_names(group):
    """First path segments at depth 0 of a `{a::x, b, c::{d, e}}` group: `[a, b, c]`."""
    names = []
    for item in split_top(group):
        m = re.match(r"\s*(" + IDENT + r")", item)
        if m and m.group(1) != "self":
            names.append(m.group(1))
    return names


def split_top(group):
    """The items of a use group, split at the commas outside nested braces."""
    items, depth, cur = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return items


def self_test():
    assert top_level_names("chat, health, rollout") == ["chat", "health", "rollout"]
    assert top_level_names("a::x, b") == ["a", "b"]
    assert top_level_names("a::{x, y}, b::z,\n c") == ["a", "b", "c"]
    assert referenced("use crate::{router};") == {"router"}
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def referenced(text):
    names = set(re.findall(r"\bcrate::(" + IDENT + r")\b", text))
    for m in re.finditer(r"\bcrate::\{", text):
        names.update(top_level_names(brace_group(text, m.end() - 1)))
    return names


def crate_graph(crate):
    src = crate / "src"
    root = src / "lib.rs"
    if not root.exists():
        root = src / "main.rs"
    if not root.exists():
        return {}
    root_text = strip_comments(root.read_text())
    modules = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", root_text, re.M))
    # Items lib.rs re-exports from a module: `crate::Item` depends on that module.
    reexports = {}
    for m in re.finditer(r"pub\s+use\s+(" + IDENT + r")::", root_text):
        module = m.group(1)
        if module not in modules:
            continue
        rest = root_text[m.end() :]
        if rest.startswith("{"):
            items = re.findall(IDENT, brace_group(rest, 0))
        else:
            items = re.findall(r"^(?:" + IDENT + r"::)*(" + IDENT + r")", rest)[:1]
        for item in items:
            reexports.setdefault(item, module)
    edges = {m: set() for m in modules}
    for module in modules:
        files = [src / f"{module}.rs"] + sorted((src / module).rglob("*.rs"))
        for f in files:
            if not f.exists():
                continue
            text = without_tests(strip_comments(f.read_text()))
            refs = referenced(text)
            if f == src / f"{module}.rs":
                refs |= set(re.findall(r"\bsuper::(" + IDENT + r")\b", text))
            for name in refs:
                target = name if name in modules else reexports.get(name)
                if target and target != module:
                    edges[module].add(target)
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv):
    self_test()
    show = "--graph" in argv
    dirs = [pathlib.Path(a) for a in argv if a != "--graph"]
    if not dirs:
        here = pathlib.Path(__file__).resolve().parent.parent
        dirs = sorted(here.glob("crates/*")) + sorted(here.glob("bins/*"))
        dirs += sorted(d for d in here.glob("tools/*") if (d / "Cargo.toml").is_file())
        dirs += sorted(here.glob("tools/bins/*"))
    found = False
    for crate in dirs:
        edges = crate_graph(crate)
        if show:
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print(f"{crate.name}: {a} -> {b}")
        for comp in cycles(edges):
            found = True
            print(f"{crate.name}: module cycle: {' <-> '.join(comp)}")
    if not found:
        print(f"no module cycles in {len(dirs)} crates")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
