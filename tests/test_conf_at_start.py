"""No Spark: a conf file edited while no ``trickle run`` was alive is applied when the next run starts.

Before, a run skipped every stream table already in the catalog, so an edited query, schedule or refresh mode
was silently ignored until the file was edited again under a running job (found trying the web page: the
catalog kept 30s while the conf said 5s)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit


def test_edits_made_between_runs_become_alters_at_start(tmp_path: Path) -> None:
    from pipeline.conf import load_conf
    from pipeline.conf_reload import Alter, at_start

    f = tmp_path / "c.yaml"
    f.write_text("stream_tables:\n"
                 "  - {name: a, query: 'SELECT x, z FROM s'}\n"
                 "  - {name: B, query: SELECT y FROM s, schedule: 5s}\n"
                 "  - {name: c, query: SELECT 1 AS one FROM s, refresh_mode: FULL}\n"
                 "  - {name: new, query: SELECT 2 AS two FROM s}\n")
    conf = load_conf(f)
    specs = {s.name.lower(): s for s in conf.stream_tables}
    catalog = {"a": ("SELECT x FROM s", specs["a"].schedule, specs["a"].refresh_mode, "spark"),
               "b": ("SELECT y FROM s", "30s", specs["b"].refresh_mode, "spark"),
               "c": ("SELECT 1 AS one FROM s", specs["c"].schedule, "DIFFERENTIAL", "spark")}
    assert at_start(conf, catalog) == [Alter("a", query="SELECT x, z FROM s"), Alter("b", schedule="5s"),
                                       Alter("c", refresh_mode="FULL")]
    # a catalog that already matches the conf (the run created it): nothing to do
    same = {k: (s.query, s.schedule, s.refresh_mode, s.dialect) for k, s in specs.items()}
    assert at_start(conf, same) == []
