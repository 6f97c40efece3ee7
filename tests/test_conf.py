"""Unit tests of the conf file loader (pure Python: no Spark, no JVM).

Why so many error cases: the loader's whole job is to fail *before* Spark starts, with a message a person
can act on. So every rejected input asserts that the message starts with the conf file's path and names the
offending key or value and what is accepted, not just that some ConfigError was raised.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.debezium import DecodeError, SourceSchema, coerce
from pipeline.conf import (
    DeltaSourceSpec,
    KafkaSourceSpec,
    RuntimeSpec,
    StreamTableSpec,
    TrickleConf,
    load_conf,
    normalize_type,
)
from pipeline.errors import CatalogError, ConfigError
from pipeline.schedule import validate_schedule

pytestmark = pytest.mark.unit  # no Spark: ./dev test -m unit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"


# ------------------------------------------------------------------------------------------------ helpers


def write_conf(tmp_path: Path, data: dict[str, Any] | str, name: str = "trickle.yaml") -> Path:
    """Write ``data`` (a mapping dumped as YAML, or YAML text, dedented) and return the file's path."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        text = textwrap.dedent(data)
    else:
        text = yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, data: dict[str, Any] | str) -> TrickleConf:
    return load_conf(write_conf(tmp_path, data))


def conf_error(tmp_path: Path, data: dict[str, Any] | str, *fragments: str) -> str:
    """Load ``data``, expect a ConfigError starting with the file's path and containing every fragment."""
    path = write_conf(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_conf(path)
    msg = str(info.value)
    assert msg.startswith(str(path.resolve()) + ": "), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    return msg


def kafka(**overrides: Any) -> dict[str, Any]:
    """A valid Kafka source entry; ``overrides`` replace keys (a value of ``...`` removes the key)."""
    src: dict[str, Any] = {
        "name": "orders",
        "kind": "kafka",
        "topic": "shop.public.orders",
        "bootstrap_servers": "127.0.0.1:9092",
        "columns": {"id": "BIGINT", "amount": "DECIMAL(10,2)"},
        "key": ["id"],
    }
    for k, v in overrides.items():
        if v is ...:
            src.pop(k, None)
        else:
            src[k] = v
    return src


def one_source(**overrides: Any) -> dict[str, Any]:
    return {"sources": [kafka(**overrides)]}


def stream_table(**overrides: Any) -> dict[str, Any]:
    st: dict[str, Any] = {"name": "totals", "query": "SELECT 1 AS x"}
    for k, v in overrides.items():
        if v is ...:
            st.pop(k, None)
        else:
            st[k] = v
    return st


# ---------------------------------------------------------------------------------------- example files


def test_demo_conf_loads() -> None:
    conf = load_conf(CONF_DIR / "demo.yaml")
    assert [s.name for s in conf.stream_tables] == [
        "department_tree",
        "department_stats",
        "department_report",
    ]
    assert all(s.schedule == "30s" for s in conf.stream_tables)
    assert conf.stream_tables[0].refresh_mode == "DIFFERENTIAL"  # WITH RECURSIVE is differentiated
    assert conf.warehouse == PROJECT_ROOT / "warehouse"
    assert conf.spark == {"spark.sql.shuffle.partitions": "4"}
    assert conf.sources == [] and conf.checkpoints is None


def test_kafka_debezium_example_loads() -> None:
    conf = load_conf(CONF_DIR / "kafka_debezium.yaml")
    orders, customers, regions = conf.sources
    assert isinstance(orders, KafkaSourceSpec) and isinstance(customers, KafkaSourceSpec)
    assert isinstance(regions, DeltaSourceSpec) and regions.path is None
    assert (orders.topic, customers.topic) == ("shop.public.orders", "shop.public.customers")
    assert orders.bootstrap_servers == customers.bootstrap_servers == "127.0.0.1:9092"
    assert orders.columns == (
        ("id", "BIGINT"),
        ("customer_id", "BIGINT"),
        ("amount", "DECIMAL(10,2)"),
        ("status", "STRING"),
        ("created_at", "TIMESTAMP"),
    )
    assert [n for n, _ in customers.columns] == ["id", "name", "email", "region_id", "created_at"]
    assert orders.key == customers.key == ("id",)
    assert orders.dead_letter == "orders_dead_letter"
    assert orders.kafka_options == {"maxOffsetsPerTrigger": "10000", "kafka.security.protocol": "PLAINTEXT"}
    assert customers.trigger_seconds == 5.0

    immediate, scheduled = conf.stream_tables
    assert (immediate.refresh_mode, immediate.schedule) == ("IMMEDIATE", None)
    assert scheduled.schedule == "*/5 * * * *"
    assert "JOIN customers" in scheduled.query  # read from conf/sql/customer_orders.sql
    assert conf.checkpoints == PROJECT_ROOT / "checkpoints"
    assert conf.warehouse == PROJECT_ROOT / "warehouse"
    assert conf.runtime == RuntimeSpec()


def test_example_kafka_sources_fit_the_decoder() -> None:
    """Whatever the conf accepts, the Debezium decoder must accept too (same columns/key shape)."""
    conf = load_conf(CONF_DIR / "kafka_debezium.yaml")
    for src in conf.sources:
        if isinstance(src, KafkaSourceSpec):
            schema = SourceSchema(columns=src.columns, key=src.key)
            assert schema.columns == src.columns


@pytest.mark.parametrize(
    "type_",
    [
        "BOOLEAN",
        "TINYINT",
        "SMALLINT",
        "INT",
        "BIGINT",
        "FLOAT",
        "DOUBLE",
        "DECIMAL(38,38)",
        "DECIMAL(1,0)",
        "STRING",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP_NTZ",
        "BINARY",
    ],
)
def test_every_canonical_type_is_accepted_by_the_decoder(type_: str) -> None:
    assert normalize_type(type_) == type_
    SourceSchema(columns=(("id", "BIGINT"), ("v", type_)), key=("id",))


@pytest.mark.parametrize(
    ("given", "canonical", "value"),
    [("BYTE", "TINYINT", 7), ("SHORT", "SMALLINT", -300), ("long", "BIGINT", 2**40),
     ("TIMESTAMP_LTZ", "TIMESTAMP", 1_700_000_000_000_000), ("numeric(5,1)", "DECIMAL(5,1)", "12.5"),
     ("varchar(10)", "STRING", "x")],
)
def test_the_conf_and_the_decoder_read_a_type_alike(given: str, canonical: str, value: Any) -> None:
    # BYTE, SHORT and TIMESTAMP_LTZ were decoder-only: the conf refused them
    assert normalize_type(given) == canonical
    SourceSchema(columns=(("id", "BIGINT"), ("v", given)), key=("id",))
    assert coerce(value, given) == coerce(value, canonical) is not None
    with pytest.raises(DecodeError, match=f"^expected {re.escape(canonical)}, got "):
        coerce(True, given)


@pytest.mark.parametrize("given", ["VARCHAR", "CHAR(0)", "INT(11)", "DECIMAL(39,2)", "UUID"])
def test_the_conf_and_the_decoder_refuse_a_type_alike(given: str) -> None:
    # a VARCHAR without its length was decoder-only: the conf refused it
    with pytest.raises(ValueError) as conf_error_:
        normalize_type(given)
    with pytest.raises(ValueError) as decoder_error:
        SourceSchema(columns=(("id", "BIGINT"), ("v", given)), key=("id",))
    assert str(conf_error_.value) == str(decoder_error.value)


# ------------------------------------------------------------------------------------------------ defaults


def test_defaults(tmp_path: Path) -> None:
    conf = load(tmp_path, {"stream_tables": [stream_table()]})
    assert conf.sources == []
    assert conf.checkpoints is None and conf.warehouse is None
    assert conf.runtime == RuntimeSpec(
        tick_seconds=1.0,
        max_consecutive_errors=3,
        retry_backoff_seconds=1.0,
        retry_backoff_max_seconds=300.0,
        scheduler_threads=2,
    )
    assert conf.stream_tables == [StreamTableSpec("totals", "SELECT 1 AS x", "1m", "AUTO")]


def test_empty_file_is_an_empty_conf(tmp_path: Path) -> None:
    conf = load(tmp_path, "")
    assert conf == TrickleConf(path=(tmp_path / "trickle.yaml").resolve())


def test_kafka_source_defaults(tmp_path: Path) -> None:
    (src,) = load(tmp_path, one_source()).sources
    assert src == KafkaSourceSpec(
        name="orders",
        topic="shop.public.orders",
        bootstrap_servers="127.0.0.1:9092",
        columns=(("id", "BIGINT"), ("amount", "DECIMAL(10,2)")),
        key=("id",),
        dead_letter=None,
        starting_offsets="earliest",
        kafka_options={},
        trigger_seconds=1.0,
    )
    assert src.kind == "kafka"


def test_explicit_null_means_default(tmp_path: Path) -> None:
    conf = load(
        tmp_path,
        {
            "checkpoints": None,
            "sources": [kafka(dead_letter=None, starting_offsets=None, trigger_seconds=None)],
            "runtime": {"scheduler_threads": None},
        },
    )
    (src,) = conf.sources
    assert isinstance(src, KafkaSourceSpec)
    assert (src.dead_letter, src.starting_offsets, src.trigger_seconds) == (None, "earliest", 1.0)
    assert conf.checkpoints is None and conf.runtime.scheduler_threads == 2


def test_runtime_values(tmp_path: Path) -> None:
    runtime = {
        "tick_seconds": 0.5,
        "max_consecutive_errors": 5,
        "retry_backoff_seconds": 2,
        "retry_backoff_max_seconds": 2,
        "scheduler_threads": 4,
    }
    assert load(tmp_path, {"runtime": runtime}).runtime == RuntimeSpec(0.5, 5, 2.0, 2.0, 4)


def test_kafka_source_values(tmp_path: Path) -> None:
    data = one_source(
        key="id",
        dead_letter="orders_dlq",
        starting_offsets="LATEST",
        bootstrap_servers=["10.0.0.1:9092", "10.0.0.2:9093"],
        kafka_options={
            "kafka.security.protocol": "SSL",
            "maxOffsetsPerTrigger": 500,
            "failOnDataLoss": False,
            "includeHeaders": "true",
        },
        trigger_seconds=0.25,
    )
    (src,) = load(tmp_path, data).sources
    assert isinstance(src, KafkaSourceSpec)
    assert src.key == ("id",)
    assert src.dead_letter == "orders_dlq"
    assert src.starting_offsets == "latest"
    assert src.bootstrap_servers == "10.0.0.1:9092,10.0.0.2:9093"
    assert src.kafka_options == {
        "kafka.security.protocol": "SSL",
        "maxOffsetsPerTrigger": "500",
        "failOnDataLoss": "false",
        "includeHeaders": "true",
    }
    assert src.trigger_seconds == 0.25


def test_key_is_matched_case_insensitively_and_spelled_as_the_column(tmp_path: Path) -> None:
    data = one_source(columns={"OrderId": "BIGINT", "Line": "INT"}, key=["orderid", "LINE"])
    (src,) = load(tmp_path, data).sources
    assert isinstance(src, KafkaSourceSpec) and src.key == ("OrderId", "Line")


# ------------------------------------------------------------------------------------------------ columns


def test_compact_and_list_columns_give_the_same_source(tmp_path: Path) -> None:
    compact = load(
        tmp_path / "a",
        """
        sources:
          - name: orders
            kind: kafka
            topic: t
            bootstrap_servers: 127.0.0.1:9092
            columns: {zeta: BIGINT, amount: "DECIMAL(10,2)", alpha: varchar(5), m: long}
            key: zeta
        """,
    )
    listed = load(
        tmp_path / "b",
        """
        sources:
          - name: orders
            kind: kafka
            topic: t
            bootstrap_servers: 127.0.0.1:9092
            columns:
              - {name: zeta, type: BIGINT}
              - {name: amount, type: "DECIMAL(10,2)"}
              - name: alpha
                type: varchar(5)
              - {name: m, type: long}
            key: [zeta]
        """,
    )
    assert compact.sources == listed.sources
    (src,) = compact.sources
    assert isinstance(src, KafkaSourceSpec)
    # the YAML order, not sorted
    assert src.columns == (
        ("zeta", "BIGINT"),
        ("amount", "DECIMAL(10,2)"),
        ("alpha", "STRING"),
        ("m", "BIGINT"),
    )


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("boolean", "BOOLEAN"),
        ("tinyint", "TINYINT"),
        ("SmallInt", "SMALLINT"),
        ("integer", "INT"),
        ("int", "INT"),
        ("long", "BIGINT"),
        ("bigint", "BIGINT"),
        ("real", "FLOAT"),
        ("float", "FLOAT"),
        ("double", "DOUBLE"),
        ("decimal( 10 , 2 )", "DECIMAL(10,2)"),
        ("DECIMAL(38,0)", "DECIMAL(38,0)"),
        ("decimal", "DECIMAL(10,0)"),
        ("decimal(7)", "DECIMAL(7,0)"),
        ("numeric(12,4)", "DECIMAL(12,4)"),
        ("string", "STRING"),
        ("varchar(255)", "STRING"),
        ("CHAR(1)", "STRING"),
        ("date", "DATE"),
        ("timestamp", "TIMESTAMP"),
        ("timestamp_ntz", "TIMESTAMP_NTZ"),
        ("timestamp_ltz", "TIMESTAMP"),
        ("byte", "TINYINT"),
        ("Short", "SMALLINT"),
        ("binary", "BINARY"),
    ],
)
def test_type_normalisation(tmp_path: Path, given: str, canonical: str) -> None:
    (src,) = load(tmp_path, one_source(columns={"id": "BIGINT", "v": given})).sources
    assert isinstance(src, KafkaSourceSpec) and src.columns[1] == ("v", canonical)


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("UUID", "supported: BOOLEAN, TINYINT"),
        ("MAP<STRING,INT>", "supported:"),
        ("ARRAY<INT>", "supported:"),
        ("STRUCT<a: INT>", "supported:"),
        ("INT(11)", "supported:"),
        ("DECIMAL(39,2)", "1 <= precision <= 38"),
        ("DECIMAL(0,0)", "1 <= precision <= 38"),
        ("DECIMAL(5,6)", "0 <= scale <= precision"),
        ("VARCHAR", "VARCHAR needs a positive length"),
        ("CHAR(0)", "CHAR needs a positive length"),
    ],
)
def test_unsupported_type(tmp_path: Path, given: str, hint: str) -> None:
    conf_error(
        tmp_path, one_source(columns={"id": "BIGINT", "v": given}), "sources[0] 'orders'", repr(given), hint
    )


def test_unsupported_type_in_list_form_names_the_column_position(tmp_path: Path) -> None:
    columns = [{"name": "id", "type": "BIGINT"}, {"name": "tags", "type": "ARRAY<STRING>"}]
    conf_error(
        tmp_path, one_source(columns=columns), "sources[0] 'orders' columns[1]", "'tags'", "supported:"
    )


def test_type_must_be_a_string(tmp_path: Path) -> None:
    conf_error(tmp_path, one_source(columns={"id": 5}), "columns.id", "must be a string", "supported:")


@pytest.mark.parametrize(
    ("columns", "fragments"),
    [
        ({"id": "BIGINT", "1st": "INT"}, ("'1st'", "letters, digits and underscores")),
        ({"id": "BIGINT", "has space": "INT"}, ("'has space'", "letters, digits and underscores")),
        ({"id": "BIGINT", "__op": "STRING"}, ("'__op'", "reserved for hidden columns")),
        ({"id": "BIGINT", "ID": "INT"}, ("duplicate column 'ID'", "case-insensitive")),
        ({}, ("'columns' must list at least one column",)),
        ([], ("'columns' must list at least one column",)),
        ("id BIGINT", ("'columns' must be a mapping",)),
        ([{"name": "id", "type": "BIGINT"}, "amount"], ("columns[1] must be a mapping",)),
        ([{"name": "id"}], ("columns[0]: 'type' is required",)),
        ([{"type": "BIGINT"}], ("columns[0]: 'name' is required",)),
    ],
)
def test_bad_columns(tmp_path: Path, columns: Any, fragments: tuple[str, ...]) -> None:
    conf_error(tmp_path, one_source(columns=columns), "sources[0] 'orders'", *fragments)


def test_yaml_boolean_column_name_says_to_quote_it(tmp_path: Path) -> None:
    text = """
    sources:
      - name: orders
        kind: kafka
        topic: t
        bootstrap_servers: 127.0.0.1:9092
        columns: {id: BIGINT, on: BOOLEAN}
        key: id
    """
    conf_error(tmp_path, text, "column name True is not a string", "quote it")


def test_unknown_key_in_a_column(tmp_path: Path) -> None:
    columns = [{"name": "id", "type": "BIGINT", "nullable": False}]
    conf_error(
        tmp_path,
        one_source(columns=columns),
        "unknown key 'nullable'",
        "sources[0] 'orders' columns[0]",
        "name, type",
    )


# ------------------------------------------------------------------------------------------------ sources


@pytest.mark.parametrize("key", ["topic", "bootstrap_servers", "key"])
def test_kafka_required_keys(tmp_path: Path, key: str) -> None:
    conf_error(
        tmp_path, one_source(**{key: ...}), "sources[0] 'orders'", f"'{key}' is required for a kafka source"
    )


def test_kafka_columns_may_be_left_out(tmp_path: Path) -> None:
    """Without a column list the mirror's columns (and without a key, the key) come from the events' Connect
    schemas at run time (connectors/debezium_schema.py)."""
    src = load_conf(write_conf(tmp_path, one_source(columns=..., key=...))).sources[0]
    assert isinstance(src, KafkaSourceSpec) and (src.columns, src.key) == ((), ())
    src = load_conf(write_conf(tmp_path, one_source(columns=..., key=["id", "Region"]))).sources[0]
    assert isinstance(src, KafkaSourceSpec) and (src.columns, src.key) == ((), ("id", "Region"))


def test_kind_is_required(tmp_path: Path) -> None:
    conf_error(
        tmp_path, {"sources": [{"name": "departments"}]}, "sources[0] 'departments'", "'kind' is required"
    )


def test_kind_must_be_known(tmp_path: Path) -> None:
    conf_error(tmp_path, one_source(kind="postgres"), "sources[0] 'orders'", "'postgres'", "kafka, delta")


def test_source_name_is_required(tmp_path: Path) -> None:
    conf_error(tmp_path, one_source(name=...), "sources[0]:", "'name' is required")


def test_sources_must_be_a_list(tmp_path: Path) -> None:
    conf_error(tmp_path, {"sources": {"orders": kafka()}}, "'sources' must be a list")


def test_unknown_key_in_a_kafka_source(tmp_path: Path) -> None:
    data = {"sources": [{"name": "regions", "kind": "delta"}, kafka(topics="x")]}
    conf_error(
        tmp_path,
        data,
        "unknown key 'topics'",
        "at sources[1] 'orders'",
        "allowed:",
        "bootstrap_servers",
        "topic,",
    )


def test_unknown_key_in_a_delta_source(tmp_path: Path) -> None:
    data = {"sources": [{"name": "regions", "kind": "delta", "topic": "x"}]}
    conf_error(tmp_path, data, "unknown key 'topic'", "at sources[0] 'regions'", "allowed: kind, name, path")


def test_delta_source_with_relative_path(tmp_path: Path) -> None:
    data = {
        "sources": [
            {"name": "regions", "kind": "delta", "path": "../tables/regions"},
            {"name": "db.x", "kind": "delta"},
        ]
    }
    conf = load_conf(write_conf(tmp_path, data, name="conf/trickle.yaml"))
    assert conf.sources == [
        DeltaSourceSpec("regions", (tmp_path / "tables" / "regions").resolve()),
        DeltaSourceSpec("db.x", None),
    ]


@pytest.mark.parametrize("name", ["my orders", "1orders", "db.orders"])
def test_kafka_source_name_must_be_an_identifier(tmp_path: Path, name: str) -> None:
    conf_error(tmp_path, one_source(name=name), f"sources[0] {name!r}", "invalid name", "letters, digits")


def test_duplicate_source_names(tmp_path: Path) -> None:
    data = {"sources": [kafka(), {"name": "Orders", "kind": "delta"}]}
    conf_error(tmp_path, data, "sources[1] 'Orders'", "already used by sources[0] 'orders'", "must be unique")


def test_source_name_equal_to_a_stream_table_name(tmp_path: Path) -> None:
    data = {"sources": [kafka()], "stream_tables": [stream_table(name="orders")]}
    conf_error(tmp_path, data, "sources[0] 'orders'", "already used by stream_tables[0] 'orders'")


def test_dead_letter_must_not_be_a_source_or_stream_table(tmp_path: Path) -> None:
    data = {"sources": [kafka(dead_letter="totals")], "stream_tables": [stream_table()]}
    conf_error(tmp_path, data, "sources[0] 'orders'", "'dead_letter' 'totals'", "stream_tables[0] 'totals'")


def test_dead_letter_must_be_a_table_name(tmp_path: Path) -> None:
    conf_error(
        tmp_path,
        one_source(dead_letter="dead letters"),
        "'dead_letter' must be a table name",
        "'dead letters'",
    )


@pytest.mark.parametrize(
    ("key", "fragments"),
    [
        ([], ("'key' must be a column name or a non-empty list",)),
        ("", ("'key' must be a column name or a non-empty list",)),
        (["customer"], ("key column 'customer' is not in 'columns' (id, amount)",)),
        (["id", "ID"], ("key column 'ID' is listed twice",)),
        ({"id": 1}, ("'key' must be a column name",)),
    ],
)
def test_bad_key(tmp_path: Path, key: Any, fragments: tuple[str, ...]) -> None:
    conf_error(tmp_path, one_source(key=key), "sources[0] 'orders'", *fragments)


@pytest.mark.parametrize("value", ["beginning", "EARLIEST-1", 0])
def test_bad_starting_offsets(tmp_path: Path, value: Any) -> None:
    conf_error(
        tmp_path, one_source(starting_offsets=value), "'starting_offsets'", repr(value), "earliest, latest"
    )


@pytest.mark.parametrize("value", [0, -1, "fast", True])
def test_bad_trigger_seconds(tmp_path: Path, value: Any) -> None:
    conf_error(
        tmp_path,
        one_source(trigger_seconds=value),
        "sources[0] 'orders'.trigger_seconds",
        repr(value),
        "positive",
    )


@pytest.mark.parametrize(
    "value", ["localhost", "127.0.0.1", "127.0.0.1:port", "", 9092, ["127.0.0.1:9092", 1]]
)
def test_bad_bootstrap_servers(tmp_path: Path, value: Any) -> None:
    conf_error(
        tmp_path, one_source(bootstrap_servers=value), "'bootstrap_servers' must be host:port", repr(value)
    )


def test_topic_must_be_a_string(tmp_path: Path) -> None:
    conf_error(tmp_path, one_source(topic=["a", "b"]), "'topic' must be a non-empty string")


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (
            {"maxOffsetPerTrigger": 10},
            ("unknown key 'maxOffsetPerTrigger' in kafka_options", "'kafka.'", "maxOffsetsPerTrigger"),
        ),
        ({"subscribe": "x"}, ("unknown key 'subscribe'",)),
        ({"kafka.": "x"}, ("unknown key 'kafka.'",)),
        (
            {"kafka.bootstrap.servers": "h:1"},
            ("'kafka.bootstrap.servers' is not allowed", "bootstrap_servers"),
        ),
        ({"kafka.auto.offset.reset": "earliest"}, ("not allowed", "starting_offsets")),
        ({"failOnDataLoss": "no way"}, ("'failOnDataLoss' must be true or false",)),
        ({"maxOffsetsPerTrigger": 0}, ("'maxOffsetsPerTrigger' must be a positive integer",)),
        ({"maxOffsetsPerTrigger": "lots"}, ("'maxOffsetsPerTrigger' must be a positive integer",)),
        ({"kafka.client.id": None}, ("'kafka.client.id' must be a scalar",)),
        (["maxOffsetsPerTrigger"], ("'kafka_options' must be a mapping",)),
    ],
)
def test_bad_kafka_options(tmp_path: Path, options: Any, fragments: tuple[str, ...]) -> None:
    conf_error(tmp_path, one_source(kafka_options=options), "sources[0] 'orders'", *fragments)


# ------------------------------------------------------------------------------------------- checkpoints


def test_relative_checkpoints_resolve_against_the_conf_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_conf(tmp_path, {"checkpoints": "../state/ckpt", "warehouse": "wh"}, name="conf/trickle.yaml")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # started from another folder, conf given by a relative path
    conf = load_conf(Path("..") / "conf" / "trickle.yaml")
    assert conf.path == path.resolve()
    assert conf.checkpoints == (tmp_path / "state" / "ckpt").resolve()
    assert conf.warehouse == (tmp_path / "conf" / "wh").resolve()


def test_absolute_checkpoints_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "abs" / "ckpt"
    assert load(tmp_path, {"checkpoints": str(target)}).checkpoints == target.resolve()


@pytest.mark.parametrize("value", ["", "  ", 3, ["a"]])
def test_bad_checkpoints(tmp_path: Path, value: Any) -> None:
    conf_error(tmp_path, {"checkpoints": value}, "'checkpoints' must be a non-empty path string", repr(value))


# ------------------------------------------------------------------------------------------------ runtime


@pytest.mark.parametrize(
    ("runtime", "fragments"),
    [
        ({"tick_seconds": 0}, ("runtime.tick_seconds must be a positive number", "0")),
        ({"max_consecutive_errors": 0}, ("runtime.max_consecutive_errors must be a positive integer", "0")),
        (
            {"max_consecutive_errors": 1.5},
            ("runtime.max_consecutive_errors must be a positive integer", "1.5"),
        ),
        (
            {"max_consecutive_errors": True},
            ("runtime.max_consecutive_errors must be a positive integer", "True"),
        ),
        ({"retry_backoff_seconds": 0}, ("runtime.retry_backoff_seconds must be a positive number",)),
        (
            {"retry_backoff_seconds": "1s"},
            ("runtime.retry_backoff_seconds must be a positive number", "'1s'"),
        ),
        ({"retry_backoff_max_seconds": -5}, ("runtime.retry_backoff_max_seconds must be a positive number",)),
        (
            {"retry_backoff_seconds": 10, "retry_backoff_max_seconds": 5},
            ("runtime.retry_backoff_max_seconds (5) must be >= runtime.retry_backoff_seconds (10)",),
        ),
        (
            {"retry_backoff_seconds": 600},
            ("retry_backoff_max_seconds (300, the default) must be >=", "(600)"),
        ),
        ({"scheduler_threads": 0}, ("runtime.scheduler_threads must be a positive integer",)),
        ({"scheduler_threads": "2"}, ("runtime.scheduler_threads must be a positive integer", "'2'")),
        ({"threads": 2}, ("unknown key 'threads' at runtime", "max_consecutive_errors", "scheduler_threads")),
        ([1], ("'runtime' must be a mapping",)),
    ],
)
def test_bad_runtime(tmp_path: Path, runtime: Any, fragments: tuple[str, ...]) -> None:
    conf_error(tmp_path, {"runtime": runtime}, *fragments)


# ---------------------------------------------------------------------------------------------- schedules


VALID_SCHEDULES = [
    ("30s", "30s"),
    ("5m", "5m"),
    ("1H30M", "1h30m"),
    ("2d", "2d"),
    ("calculated", "CALCULATED"),
    ("Calculated", "CALCULATED"),
    ("*/5 * * * *", "*/5 * * * *"),
    ("0  3 * *   1-5", "0 3 * * 1-5"),
    ("0 0 * * * 30", "0 0 * * * 30"),
    ("@Hourly", "@hourly"),
    ("@daily", "@daily"),
    ("@weekly", "@weekly"),
    ("@monthly", "@monthly"),
    ("@yearly", "@yearly"),
    ("@annually", "@annually"),
    ("@midnight", "@midnight"),
]
INVALID_SCHEDULES = [
    "every 5 minutes",
    "0s",
    "0m",
    "5x",
    "* * * *",
    "* * * * * * *",
    "61 * * * *",
    "@reboot",
    "@every",
    30,
    "",
]


@pytest.mark.parametrize(("given", "normalised"), VALID_SCHEDULES)
def test_valid_schedules(tmp_path: Path, given: str, normalised: str) -> None:
    (spec,) = load(tmp_path, {"stream_tables": [stream_table(schedule=given)]}).stream_tables
    assert spec.schedule == normalised


@pytest.mark.parametrize("given", INVALID_SCHEDULES)
def test_invalid_schedules(tmp_path: Path, given: Any) -> None:
    conf_error(
        tmp_path,
        {"stream_tables": [stream_table(schedule=given)]},
        "stream_tables[0] 'totals'",
        f"invalid 'schedule' {given!r}",
        "30s",
        "5 or 6 fields",
        "@hourly",
        "CALCULATED",
    )


@pytest.mark.parametrize(("given", "normalised"), VALID_SCHEDULES)
def test_the_api_accepts_every_schedule_the_conf_accepts(given: str, normalised: str) -> None:
    assert validate_schedule(given) == normalised


@pytest.mark.parametrize("given", INVALID_SCHEDULES)
def test_the_api_refuses_every_schedule_the_conf_refuses(given: Any) -> None:
    # "* * * * * * *" (7 fields: croniter reads a year) was accepted by the API and refused by the conf
    with pytest.raises(CatalogError, match="5 or 6 fields"):
        validate_schedule(given)


def test_unquoted_cron_is_a_yaml_error_naming_the_file(tmp_path: Path) -> None:
    text = """
    stream_tables:
      - name: totals
        query: SELECT 1
        schedule: */5 * * * *
    """
    conf_error(tmp_path, text, "not valid YAML")


def test_schedule_may_be_omitted_only_meaningfully(tmp_path: Path) -> None:
    conf = load(
        tmp_path,
        {
            "stream_tables": [
                stream_table(name="live", refresh_mode="immediate"),
                stream_table(name="every_minute", refresh_mode="FULL"),
                stream_table(name="live_scheduled", refresh_mode="IMMEDIATE", schedule="10s"),
            ]
        },
    )
    assert [(s.name, s.refresh_mode, s.schedule) for s in conf.stream_tables] == [
        ("live", "IMMEDIATE", None),
        ("every_minute", "FULL", "1m"),
        ("live_scheduled", "IMMEDIATE", "10s"),
    ]


# ------------------------------------------------------------------------------------------ stream tables


def test_query_file_is_read_relative_to_the_conf(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "q.sql").write_text("  SELECT 2 AS y\n", encoding="utf-8")
    (spec,) = load(
        tmp_path, {"stream_tables": [stream_table(query=..., query_file="sql/q.sql")]}
    ).stream_tables
    assert spec.query == "SELECT 2 AS y"


@pytest.mark.parametrize(
    ("entry", "fragments"),
    [
        (stream_table(name=...), ("stream_tables[0]:", "'name' is required")),
        (stream_table(name="my totals"), ("stream_tables[0] 'my totals'", "invalid name")),
        (stream_table(query=...), ("stream_tables[0] 'totals'", "exactly one of 'query' and 'query_file'")),
        (stream_table(query_file="x.sql"), ("exactly one of 'query' and 'query_file'",)),
        (stream_table(query=..., query_file="missing.sql"), ("cannot read query_file 'missing.sql'",)),
        (
            stream_table(refresh_mode="SOMETIMES"),
            ("'refresh_mode' must be one of AUTO, DIFFERENTIAL", "'SOMETIMES'"),
        ),
        (
            stream_table(refresh="FULL"),
            (
                "unknown key 'refresh' at stream_tables[0] 'totals'",
                "allowed: dialect, max_staleness, name, query, query_file, refresh_mode",
            ),
        ),
        (
            stream_table(dialect="postgress"),
            ("stream_tables[0] 'totals': 'dialect': unknown SQL dialect 'postgress': use one of", "postgres"),
        ),
        (stream_table(dialect=5), ("stream_tables[0] 'totals': 'dialect': unknown SQL dialect 5",)),
        (stream_table(dialect=""), ("'dialect': unknown SQL dialect ''",)),
    ],
)
def test_bad_stream_tables(tmp_path: Path, entry: dict[str, Any], fragments: tuple[str, ...]) -> None:
    conf_error(tmp_path, {"stream_tables": [entry]}, *fragments)


def test_dialect_is_the_one_the_query_is_read_in(tmp_path: Path) -> None:
    """``dialect`` defaults to spark and is kept lower case; the loader reads the query in it (its sources,
    the cycle check), so a PostgreSQL-only query loads with ``dialect: postgres`` and is invalid SQL
    without it."""
    from pipeline.conf import creation_order

    postgres = "SELECT id::INT AS id FROM base WHERE name ~ '^a' AND name ILIKE 'A%'"
    conf = load(tmp_path, {"stream_tables": [stream_table(name="top", query=postgres, dialect="Postgres"),
                                             stream_table(name="base", query="SELECT id, name FROM src")]})
    assert [(s.name, s.dialect) for s in conf.stream_tables] == [("top", "postgres"), ("base", "spark")]
    assert [s.name for s in creation_order(conf.stream_tables)] == ["base", "top"]
    assert load(tmp_path, {"stream_tables": [stream_table(dialect=None)]}).stream_tables[0].dialect == "spark"
    conf_error(tmp_path, {"stream_tables": [stream_table(name="top", query=postgres)]},
               "stream_tables[0] 'top'.query", "SQL")


def test_a_changed_dialect_is_a_changed_query(tmp_path: Path) -> None:
    """An edit of ``dialect`` alone ALTERs the query (the same text, read in the new dialect), as a running
    ``trickle run`` and the next start apply it; an edit of the query alone is altered in the conf's dialect
    when the catalog holds another; nothing when the catalog already has the conf's."""
    from pipeline.conf_reload import Alter, at_start, changes

    q = "SELECT id FROM src WHERE name ILIKE 'a%'"
    old = load(tmp_path, {"stream_tables": [stream_table(name="a", query=q)]})
    new = load(tmp_path, {"stream_tables": [stream_table(name="a", query=q, dialect="postgres")]})
    assert changes(old, new, {"a": q}, {"a": "spark"})[0] == [Alter("a", query=q, dialect="postgres")]
    assert changes(old, new, {"a": q})[0] == [Alter("a", query=q, dialect="postgres")]
    assert changes(old, new, {"a": q}, {"a": "postgres"})[0] == [], "the catalog already reads it so"
    assert changes(new, new, {"a": q}, {"a": "postgres"})[0] == []
    edited = load(tmp_path, {"stream_tables": [stream_table(name="a", query=q + " AND id > 1", dialect="postgres")]})
    assert changes(new, edited, {"a": q}, {"a": "postgres"})[0] == [Alter("a", query=q + " AND id > 1")]
    assert changes(new, edited, {"a": q}, {"a": "spark"})[0] == [Alter("a", query=q + " AND id > 1",
                                                                       dialect="postgres")]
    (spec,) = new.stream_tables
    assert at_start(new, {"a": (q, spec.schedule, spec.refresh_mode, "spark")}) == [
        Alter("a", query=q, dialect="postgres")]
    assert at_start(new, {"a": (q, spec.schedule, spec.refresh_mode, "postgres")}) == []


def test_duplicate_stream_tables(tmp_path: Path) -> None:
    data = {"stream_tables": [stream_table(), stream_table(name="TOTALS")]}
    conf_error(tmp_path, data, "stream table 'TOTALS' is declared twice")


# ------------------------------------------------------------------------------------------------- top level


def test_unknown_top_level_key(tmp_path: Path) -> None:
    conf_error(tmp_path, {"source": []}, "unknown key 'source' at top level", "checkpoints", "sources")


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    conf_error(tmp_path, "- a\n- b\n", "the top level must be a mapping")


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml: cannot read conf file"):
        load_conf(missing)


def test_spark_settings_are_strings(tmp_path: Path) -> None:
    spark = {"spark.sql.adaptive.enabled": True, "spark.sql.shuffle.partitions": 4}
    conf = load(tmp_path, {"spark": spark})
    assert conf.spark == {"spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "4"}


def test_cycle_between_stream_tables_fails_naming_file_and_key(tmp_path: Path) -> None:
    p = tmp_path / "cycle.yaml"
    p.write_text("""
stream_tables:
  - name: a
    query: SELECT x FROM b
  - name: b
    query: SELECT x FROM c
  - name: c
    query: SELECT x FROM a JOIN src ON a.x = src.x
""")
    with pytest.raises(ConfigError) as e:
        load_conf(p)
    msg = str(e.value)
    assert str(p) in msg and "stream_tables[0] 'a'.query" in msg and "cycle a -> b -> c -> a" in msg


def test_self_reference_and_invalid_sql_fail_at_load(tmp_path: Path) -> None:
    p = tmp_path / "self.yaml"
    p.write_text("stream_tables:\n  - name: a\n    query: SELECT x FROM a\n")
    with pytest.raises(ConfigError, match=r"stream_tables\[0\] 'a'.query: cycle a -> a"):
        load_conf(p)
    p.write_text("stream_tables:\n  - name: a\n    query: SELEC x FROM t\n")
    with pytest.raises(ConfigError, match=r"self.yaml: stream_tables\[0\] 'a'.query: .*SQL"):
        load_conf(p)


def test_stream_tables_are_created_upstream_first(tmp_path: Path) -> None:
    from pipeline.conf import creation_order

    p = tmp_path / "order.yaml"
    p.write_text("""
stream_tables:
  - name: top
    query: SELECT x FROM mid
  - name: mid
    query: SELECT x FROM base
  - name: base
    query: SELECT x FROM src
""")
    assert [s.name for s in creation_order(load_conf(p).stream_tables)] == ["base", "mid", "top"]


def test_transaction_topic_names_the_table_as_debezium_does(tmp_path: Path) -> None:
    (src,) = load(tmp_path, one_source(transaction_topic="shop.transaction")).sources
    assert isinstance(src, KafkaSourceSpec)
    assert (src.transaction_topic, src.collection) == ("shop.transaction", "public.orders")
    conf_error(tmp_path, one_source(transaction_topic="shop.tx"), "'transaction_topic' must be",
               "'<topic.prefix>.transaction'")
    conf_error(tmp_path, one_source(transaction_topic="other.transaction"), "'shop.public.orders' is not a topic",
               "'other.<schema>.<table>'")
