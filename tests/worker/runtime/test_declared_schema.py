"""A source's declared ``output_schema`` is checked against its first batch."""

from __future__ import annotations

import pyarrow as pa
import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.split_sources import GENERATOR_SCHEMA, GeneratorSource
from snapflow.worker.runtime.source_loop import check_declared_schema


class OtherRows(GeneratorSource):
    """Emits rows of another schema but inherits the generator's declaration (a mistake)."""

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"id": list(range(start, start + n))})


def test_a_source_that_emits_what_it_declares_passes() -> None:
    source = GeneratorSource(total_records=10)
    batch = pa.RecordBatch.from_pylist([{"key": 1, "value": 2, "ts": 3}], schema=GENERATOR_SCHEMA)
    check_declared_schema(source, batch)


def test_a_wrong_declaration_is_a_clear_error_naming_the_fix() -> None:
    source = OtherRows(total_records=10)
    batch = source._generate(0, 0, 3)
    with pytest.raises(
        InvalidArgumentError,
        match=r"declares output_schema \(key, value, ts\) "
        r"but emitted a batch of \(id\); set output_schema",
    ):
        check_declared_schema(source, batch)
    source.output_schema = None  # not declared: nothing to check
    check_declared_schema(source, batch)
