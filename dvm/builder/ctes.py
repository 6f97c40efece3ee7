"""WITH: a CTE's body is built once, at its first reference, and shared by every reference
(:mod:`dvm.operators.cte`); a recursive CTE read in FROM becomes a RecursiveCte over its anchor and its
recursive term, with the other CTEs it reads rendered beside it (:mod:`dvm.operators.recursive`)."""

from __future__ import annotations

from sqlglot import exp

from dvm.builder.checks import reject_unsupported
from dvm.builder.scope import Scope
from dvm.builder.syntax import select_names
from dvm.context import quote
from dvm.errors import QueryError, UnsupportedError
from dvm.operators import Node, RecursiveCte
from dvm.operators.cte import CteRef, SharedCte
from dvm.operators.recursive import analyze_step


class CteClause(Scope):
    def cte_ref(self, name: str, ctes: dict[str, exp.Expression]) -> CteRef:
        """A reference to the CTE ``name``: its body is built once, at the first reference, and shared by
        every reference (:mod:`~dvm.operators.cte`)."""
        body = ctes[name]
        shared = self.shared.get(id(body))
        if shared is None:
            node, names = self.query(body, ctes)
            shared = self.shared[id(body)] = SharedCte(name, node, names)
        return CteRef(shared, [self.fresh() for _ in shared.node.cols])

    def recursive(self, cte: exp.CTE, ctes: dict[str, exp.Expression]) -> tuple[Node, list[str]]:
        """A recursive CTE read in FROM: a :class:`RecursiveCte` over its anchor and recursive term."""
        name = cte.alias_or_name.lower()
        body = cte.this
        if not isinstance(body, exp.Union) or any(
            t.name.lower() == name and not t.db for t in body.this.find_all(exp.Table)
        ):
            raise QueryError(f"recursive CTE {name} must be <anchor> UNION [ALL] <recursive term>, the anchor "
                             "not reading the CTE itself")
        anchor, step = body.this, body.expression
        alias = cte.args.get("alias")
        columns = [c.name for c in alias.columns] if alias is not None and alias.columns else select_names(anchor)
        # other CTEs the body reads (transitively), in definition order, rendered natively beside it
        needed: set[str] = set()
        todo = [body]
        while todo:
            for t in todo.pop().find_all(exp.Table):
                n = t.name.lower()
                if not t.db and n in ctes and n != name and n not in needed:
                    needed.add(n)
                    todo.append(ctes[n])
        helpers = []
        for n, b in ctes.items():
            if n in needed:
                c = self.cte_of.get(id(b))
                cols = c.args.get("alias") if c is not None else None
                head = quote(n) + (f"({', '.join(quote(x.name) for x in cols.columns)})"
                                   if cols is not None and cols.columns else "")
                helpers.append((head, b))
        anchor_node: Node | None
        try:
            reject_unsupported(anchor)
            anchor_node, _ = self.query(anchor, ctes)
        except UnsupportedError as e:
            anchor_node = None
            self.notes.append(f"recursive CTE {name}: its anchor is diffed by evaluating it twice ({e})")
        if anchor_node is not None and len(anchor_node.cols) != len(columns):
            raise QueryError(f"recursive CTE {name} names {len(columns)} columns but its anchor has "
                             f"{len(anchor_node.cols)}")
        shape, reason = analyze_step(step, name, self.keys, self.schemas)
        node = RecursiveCte(name, columns, [self.fresh() for _ in columns], anchor, step,
                            bool(body.args.get("distinct")), dict(self.keys), helpers, anchor_node, shape,
                            reason)
        return node, columns
