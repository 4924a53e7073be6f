"""No include cycles in src/ (issue #50, "Storage and layouts as interfaces").

Reads every `#include "..."` of src/ (no binary needed) and checks two graphs:

- files: a header and its source are one node (exec/parted_output.h and
  exec/parted_output.cc are `exec/parted_output`); an edge A -> B when a file
  of A includes a header of B. A cycle (write_output.cc including
  parted_output.h, which includes write_output.h) means neither half can be
  read, changed or tested without the other.
- src/formats: each format's folder is one node (formats/fsdp_ranks), each
  file directly in src/formats is its own (formats/detect); an edge when a
  file of one includes a header of the other. A cycle means two formats are
  one in all but name (fsdp_ranks and fsdp_flat including each other).

A cycle found is printed as A -> B -> ... -> A, with the include lines that
make each edge.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".hpp", ".cpp")


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def _includes(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    # Drop block comments so a commented-out include is not an edge.
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    return INCLUDE.findall(text)


def _file_node(rel: str) -> str:
    """exec/parted_output.cc -> exec/parted_output."""
    return rel.rsplit(".", 1)[0]


def _formats_node(rel: str) -> str | None:
    """formats/fsdp_ranks/x.cc -> formats/fsdp_ranks; formats/detect.cc ->
    formats/detect; None outside src/formats."""
    parts = rel.split("/")
    if parts[0] != "formats" or len(parts) < 2:
        return None
    if len(parts) == 2:
        return _file_node(rel)
    return "/".join(parts[:2])


# Cycles this test knows of and lets pass, each until its own change removes
# it (then its entry must go: a stale entry fails too). Every other cycle,
# and any of these growing by a member, fails.
KNOWN_FILE_CYCLES = {
}

Graph = dict[str, dict[str, list[str]]]  # node -> target -> the include lines that make the edge


def _graph(node_of) -> Graph:
    graph: Graph = defaultdict(lambda: defaultdict(list))
    for path in _sources():
        rel = path.relative_to(SRC).as_posix()
        src = node_of(rel)
        if src is None:
            continue
        graph[src]  # every node, even one including nothing
        for inc in _includes(path):
            if not (SRC / inc).is_file():
                continue  # a third-party or generated header
            dst = node_of(inc)
            if dst is None or dst == src:
                continue
            graph[src][dst].append(f'{rel}: #include "{inc}"')
    return graph


def _components(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node
    (Tarjan, iterative), each as a closed path through the component; the
    component's other members are named by _describe's edges."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    component.append(n)
                    if n == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _cycles(graph: Graph) -> list[list[str]]:
    return [_closed_path(graph, c) for c in _components(graph)]


def _closed_path(graph: Graph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first node (breadth first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component + [component[0]]


def _describe(graph: Graph, known: dict = {}) -> str:
    lines = []
    for component in _components(graph):
        if frozenset(component) in known:
            continue
        members = set(component)
        lines.append(" -> ".join(_closed_path(graph, component)) + f"  (all of: {', '.join(component)})")
        # Every edge inside the component, not only the cycle's: all of them must go.
        for a in sorted(members):
            for b in sorted(graph[a]):
                if b in members:
                    for why in graph[a][b]:
                        lines.append(f"    {a} -> {b}: {why}")
    return "\n".join(lines)


def test_graph_parser_finds_a_cycle():
    graph: Graph = defaultdict(lambda: defaultdict(list))
    graph["a"]["b"].append("a.cc")
    graph["b"]["c"].append("b.cc")
    graph["c"]["a"].append("c.cc")
    graph["c"]["d"].append("c.cc")
    graph["d"]
    cycles = _cycles(graph)
    assert cycles == [["a", "b", "c", "a"]]
    assert _formats_node("formats/fsdp_ranks/rank_merge.cc") == "formats/fsdp_ranks"
    assert _formats_node("formats/detect.cc") == "formats/detect"
    assert _formats_node("exec/write_output.cc") is None
    assert _file_node("exec/parted_output.h") == _file_node("exec/parted_output.cc")


def test_no_file_include_cycle():
    graph = _graph(_file_node)
    assert len(graph) > 50, "src/ was not found or read"
    components = [frozenset(c) for c in _components(graph)]
    new = [c for c in components if c not in KNOWN_FILE_CYCLES]
    assert not new, "include cycles between files (a .h and its .cc are one node):\n" + _describe(
        graph, KNOWN_FILE_CYCLES
    )
    stale = [sorted(c) for c in KNOWN_FILE_CYCLES if c not in components]
    assert not stale, f"KNOWN_FILE_CYCLES names cycles that are gone, remove them: {stale}"


def test_no_formats_folder_cycle():
    graph = _graph(_formats_node)
    assert "formats/fsdp_ranks" in graph and "formats/detect" in graph, "src/formats was not found or read"
    cycles = _cycles(graph)
    assert not cycles, "include cycles between src/formats folders:\n" + _describe(graph)
