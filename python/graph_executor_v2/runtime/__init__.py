"""Running graphs: the kernel registry, the memory planner, the backends and ExecutorV2."""
from .executor import ExecutorV2, Plan
from .registry import Capabilities, Preferences, Selection, choose_kernel, select

__all__ = ["Capabilities", "ExecutorV2", "Plan", "Preferences", "Selection", "choose_kernel", "select"]
