"""One module per operator of the logical tree, each with its delta rule in the module docstring."""

from dvm.operators.aggregate import AggCall, Aggregate
from dvm.operators.base import Node
from dvm.operators.filter import Filter
from dvm.operators.join import InnerJoin
from dvm.operators.left_join import LeftJoin
from dvm.operators.project import Project
from dvm.operators.scan import Scan
from dvm.operators.union_all import UnionAll

__all__ = ["Node", "Scan", "Filter", "Project", "InnerJoin", "LeftJoin", "Aggregate", "AggCall", "UnionAll"]
