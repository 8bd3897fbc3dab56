#!/usr/bin/env python3
"""Import cycles between the server's source files (issue 40).

A file imports a module when it names `crate::a::b` (in a `use` or a path) or
`super::x`; that module is its file (`src/a/b.rs` or `src/a/b/mod.rs`), or the
nearest enclosing module file when the path goes on into an item. Prints each
strongly connected component of two or more files, largest first, and marks
the files outside the HTTP layer (routes, ws.rs, app.rs, http, web/, auth
(extractors, sessions), error.rs, serve, problem.rs, openapi, system.rs (the
probe and metrics routes), durability.rs (a middleware)). Exit status 1 when
a cycle holds such a file.

usage: scripts/import-cycles.py [SRC_DIR]
"""
import os, re, sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "src"
HTTP = re.compile(r"(^|/)(routes(\.rs|/)|ws\.rs$|app\.rs$|http(\.rs$|/)|web/|auth(\.rs$|/)|error\.rs$|serve(\.rs$|/)|problem\.rs$|openapi(\.rs$|/)|system\.rs$|durability\.rs$)")

files = {}
for root, _, names in os.walk(SRC):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.relpath(os.path.join(root, n), SRC)
            files[p] = open(os.path.join(root, n), encoding="utf-8").read()

def module_of(path):
    """src-relative file -> module path list (lib.rs -> [])."""
    parts = path[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts

mods = {}
for p in files:
    mods.setdefault(tuple(module_of(p)), p)
# lib.rs is the crate root
mods[()] = "lib.rs"

def file_for(segs):
    """The file of the longest prefix of segs that is a module."""
    for k in range(len(segs), 0, -1):
        f = mods.get(tuple(segs[:k]))
        if f:
            return f
    return None

# Strip comments and tests (a `#[cfg(test)] mod tests` block and tests.rs files).
def code(src):
    src = re.sub(r"//[^\n]*", "", src)
    i = src.find("#[cfg(test)]")
    return src if i < 0 else src[:i]

edges = {p: set() for p in files}
seg = r"[A-Za-z_][A-Za-z0-9_]*"
for p, src in files.items():
    if p.endswith("tests.rs") or "/tests/" in p:
        continue
    me = module_of(p)
    text = code(src)
    # Expand `use crate::a::{b, c::d}` one level of braces.
    for m in re.finditer(r"\b(crate|super)((?:::" + seg + r")*)(?:::\{([^}]*)\})?", text):
        base = [] if m.group(1) == "crate" else me[:-1] if not p.endswith("mod.rs") else me[:-1]
        if m.group(1) == "super":
            # super of a mod.rs file is the parent of its directory module;
            # of x.rs it is the directory module containing x.
            base = me[:-1]
        rest = [s for s in m.group(2).split("::") if s]
        # chained super::super
        while rest and rest[0] == "super":
            base = base[:-1]
            rest = rest[1:]
        targets = [base + rest]
        if m.group(3):
            for part in m.group(3).split(","):
                part = part.strip().split(" as ")[0]
                if part and part != "self":
                    targets.append(base + rest + [s for s in part.split("::") if s and s != "*"])
        for t in targets:
            f = file_for(t)
            if f and f != p:
                edges[p].add(f)

# Tarjan's SCC
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))
for v in files:
    if v not in index:
        strong(v)

bad = 0
for c in sorted(sccs, key=len, reverse=True):
    outside = [f for f in c if not HTTP.search(f)]
    bad += bool(outside)
    print(f"cycle of {len(c)} files, {len(outside)} outside the HTTP layer:")
    for f in c:
        print(("  * " if f in outside else "    ") + f)
print(f"{len(sccs)} cycles; {bad} hold a file outside the HTTP layer")
sys.exit(1 if bad else 0)
