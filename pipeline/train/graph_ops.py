"""Counting what TensorFlow's executor dispatches one op at a time in a traced function: on a GPU most
of them are a kernel launch each, and a step of thousands of small ones is bound by launches, not by
arithmetic (issue 45 F4). An XLA-compiled function is one call of its fused program. The count is of
the traced graph: constants and identities included, both branches of a conditional, a loop's body
once."""

from __future__ import annotations


def _calls(node) -> list[str]:
    """Names of the functions a node calls (a call's ``f``, a conditional's branches, a loop's body)."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def ops_outside_xla(graph_def) -> int:
    """The ops of ``graph_def`` (a traced function's ``GraphDef``) and of the functions it calls, the
    branches of a conditional each counted, a call of an XLA-compiled function counted as one op; its
    ``Placeholder`` nodes are the function's arguments and captured variables, not ops."""
    library = {f.signature.name: f for f in graph_def.library.function}

    def compiled(function) -> bool:
        return function.attr["_XlaMustCompile"].b if "_XlaMustCompile" in function.attr else False

    def count(nodes) -> int:
        total = 0
        for node in nodes:
            if node.op == "Placeholder":
                continue
            total += 1
            if "_XlaMustCompile" in node.attr and node.attr["_XlaMustCompile"].b:
                continue
            for name in _calls(node):
                function = library.get(name)
                if function is not None and not compiled(function):
                    total += count(function.node_def)
        return total

    return count(graph_def.node)
