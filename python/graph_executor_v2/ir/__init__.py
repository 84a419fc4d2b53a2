"""GE2's intermediate representation: tensor types, the graph, its verifier, printer and JSON form."""
from .types import Dim, TensorType
from .graph import Graph, Node, UnknownOpError, Value
from .verify import verify

__all__ = ["Dim", "TensorType", "Graph", "Node", "UnknownOpError", "Value", "verify"]
