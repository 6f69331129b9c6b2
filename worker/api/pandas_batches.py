"""pandas at the edge of a batch function: :func:`to_pandas` / :func:`from_pandas` convert a
batch. pandas is an optional extra (``pip install snapflow[pandas]``), imported only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError

if TYPE_CHECKING:
    import pandas


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as e:
        raise InvalidArgumentError(
            "this needs pandas, which Snapflow does not require: install it with "
            "`pip install 'snapflow[pandas]'` (or `pip install pandas`), or work on the "
            "pyarrow.RecordBatch directly"
        ) from e
    return pandas


def to_pandas(batch: pa.RecordBatch | pa.Table) -> pandas.DataFrame:
    """``batch`` as a pandas DataFrame (pandas must be installed)."""
    _pandas()
    return batch.to_pandas()


def from_pandas(df: pandas.DataFrame, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """A pandas DataFrame as a record batch (the index is dropped); ``schema`` fixes the
    output types (recommended: pandas infers them per batch)."""
    pd = _pandas()
    if not isinstance(df, pd.DataFrame):
        raise InvalidArgumentError(f"from_pandas needs a pandas.DataFrame, got {type(df).__name__}")
    return pa.RecordBatch.from_pandas(df, schema=schema, preserve_index=False)
