"""The errors every importer raises: one ``UnsupportedModelError`` listing every node that cannot be imported."""
from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model uses ops, attributes, dtypes or shapes GE2 cannot import; ``problems`` lists every one."""

    def __init__(self, model_name: str, problems: list[tuple[str, str, str]],
                 constant_inputs: frozenset = frozenset()):
        self.problems = problems  # (node name, op type, reason)
        self.constant_inputs = constant_inputs  # graph inputs whose values the import needs (NeedsConstant)
        lines = [f"  node '{name}' ({op_type}): {reason}" for name, op_type, reason in problems]
        super().__init__(f"model '{model_name}': {len(problems)} node(s) cannot be imported:\n"
                         + "\n".join(lines))


class Unsupported(Exception):
    """Raised by a rule: this node, with these attributes or shapes, has no GE2 translation."""


class NeedsConstant(Unsupported):
    """A rule needs the value of graph inputs (a shape, axes, starts ...) when the graph is built: the value is one of
    them, or is computed from them by nodes that fold once they are constants."""

    def __init__(self, input_names, what: str):
        self.input_names = frozenset(input_names)
        names = ", ".join(f"'{name}'" for name in sorted(self.input_names))
        given = ", ".join(f"'{name}': ..." for name in sorted(self.input_names))
        super().__init__(f"{what} comes from graph input(s) {names}; GE2 plans shapes when it compiles: pass their "
                         f"values in constant_inputs={{{given}}}")
