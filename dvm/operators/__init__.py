"""One module per operator of the logical tree, each with its delta rule in the module docstring."""

from dvm.operators.aggregate import AggCall, Aggregate
from dvm.operators.anti_join import AntiJoin
from dvm.operators.base import Node
from dvm.operators.filter import Filter
from dvm.operators.full_join import FullJoin
from dvm.operators.generate import Generate
from dvm.operators.join import InnerJoin
from dvm.operators.lateral import LateralJoin
from dvm.operators.left_join import LeftJoin
from dvm.operators.mark_join import Mark, MarkJoin
from dvm.operators.project import Project
from dvm.operators.recursive import RecursiveCte
from dvm.operators.scan import Scan
from dvm.operators.semi_join import SemiJoin
from dvm.operators.set_op import SetOp
from dvm.operators.topk import TopK
from dvm.operators.union_all import UnionAll
from dvm.operators.window import Window

__all__ = ["Node", "Scan", "Filter", "Project", "InnerJoin", "LeftJoin", "Aggregate", "AggCall", "UnionAll"]
__all__ += ["FullJoin", "SemiJoin", "AntiJoin", "Mark", "MarkJoin", "TopK", "Window", "Generate", "LateralJoin",
           "SetOp", "RecursiveCte"]
