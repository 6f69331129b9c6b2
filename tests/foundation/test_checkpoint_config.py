"""A job's checkpoint config (``snapflow/checkpoint_config.py``, its state backend options in
``snapflow/state_backend_options.py``) and its proto mapping (``snapflow.wire``): every config
round-trips through the message, an empty message gets the defaults, and what a client or a
user may not set is refused with an ``InvalidArgumentError`` naming the field (prefixed with
``checkpoint_config.`` when it came in a message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from snapflow import limits, wire
from snapflow.checkpoint_config import CheckpointConfig, parse_checkpoint_mode
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import InvalidArgumentError, InvalidFieldError
from snapflow.state_backend_options import StateBackendOptions, parse_state_backend
from snapflow.v1 import common_pb2 as pb


def _refused(match: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        call()


# --- checkpoint config -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        CheckpointConfig(),
        CheckpointConfig(
            interval_ms=500,
            timeout_ms=20_000,
            min_pause_ms=100,
            max_concurrent=3,
            tolerable_failures=None,
            retained=5,
            storage_uri="/shared/checkpoints",
        ),
        CheckpointConfig(mode=CheckpointMode.UNALIGNED, tolerable_failures=2),
        CheckpointConfig(aligned_checkpoint_timeout_ms=50, storage_uri="file:///shared/chk"),
        CheckpointConfig(mode=CheckpointMode.AT_LEAST_ONCE, storage_uri="s3://bucket/prefix"),
        CheckpointConfig(
            state_backend="rocksdb",
            state_backend_options=StateBackendOptions(
                memory_budget_bytes=64 << 20,
                cache_entries=0,
                compaction_style="universal",
                compaction_trigger=4,
                max_size_amplification_percent=200,
                upload_threads=2,
                local_recovery=True,
            ),
        ),
        CheckpointConfig(
            state_backend="rocksdb", state_backend_options=StateBackendOptions(local_recovery=False)
        ),
        CheckpointConfig(inline_state_threshold_bytes=0, storage_uri="/files/only"),
        CheckpointConfig(inline_state_threshold_bytes=limits.MAX_INLINE_STATE_THRESHOLD_BYTES),
    ],
    ids=lambda c: f"{c.mode.value}-{c.state_backend}-{c.storage_uri or 'default'}",
)
def test_checkpoint_configs_round_trip(config: CheckpointConfig) -> None:
    msg = wire.checkpoint_config_to_pb(config)
    assert (
        wire.checkpoint_config_from_pb(pb.CheckpointConfig.FromString(msg.SerializeToString()))
        == config
    )


def test_an_empty_config_gets_the_defaults() -> None:
    assert wire.checkpoint_config_from_pb(pb.CheckpointConfig()) == CheckpointConfig()
    # Flink's state.storage.fs.memory-threshold default; 0 (files only) is a value, not unset
    assert CheckpointConfig().inline_state_threshold_bytes == 20 * 1024
    zero = pb.CheckpointConfig(inline_state_threshold_bytes=0)
    assert wire.checkpoint_config_from_pb(zero).inline_state_threshold_bytes == 0
    # UNSPECIFIED is ALIGNED; a state backend name is read case-insensitively.
    got = wire.checkpoint_config_from_pb(pb.CheckpointConfig(state_backend=" RocksDB "))
    assert (got.mode, got.state_backend) == (CheckpointMode.ALIGNED, "rocksdb")


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (
            pb.CheckpointConfig(interval_ms=-1),
            r"^checkpoint_config.interval_ms must be >= 0, got -1$",
        ),
        (pb.CheckpointConfig(retained=-1), r"^checkpoint_config.retained must be >= 1, got -1$"),
        (
            pb.CheckpointConfig(interval_ms=5),
            r"^checkpoint_config.interval_ms 5 is below the minimum of 10 ms: use 0 \(checkpointing off\)",
        ),
        (
            pb.CheckpointConfig(timeout_ms=5),
            r"^checkpoint_config.timeout_ms 5 is below the minimum of 10 ms$",
        ),
        (
            pb.CheckpointConfig(max_concurrent=limits.MAX_CONCURRENT_CHECKPOINTS + 1),
            r"^checkpoint_config.max_concurrent 1001 is above the maximum of 1000$",
        ),
        (
            pb.CheckpointConfig(state_backend="disk"),
            r"^checkpoint_config.state_backend 'disk' is not one of heap, rocksdb$",
        ),
        (
            pb.CheckpointConfig(
                mode=wire.CHECKPOINT_MODE.to_pb(CheckpointMode.UNALIGNED),
                aligned_checkpoint_timeout_ms=50,
            ),
            r"aligned_checkpoint_timeout_ms applies only to ALIGNED mode$",
        ),
        (
            pb.CheckpointConfig(aligned_checkpoint_timeout_ms=50, max_concurrent=2),
            r"^checkpoint_config.max_concurrent 2 needs aligned checkpoints",
        ),
        (
            pb.CheckpointConfig(storage_uri="relative/dir"),
            r"must be an absolute path or file:///absolute/path",
        ),
        (pb.CheckpointConfig(storage_uri="hdfs://nn/x"), r"uses the URI scheme 'hdfs'"),
        (
            pb.CheckpointConfig(state_backend_options=pb.StateBackendOptions(upload_threads=0)),
            r"^checkpoint_config.state_backend_options.upload_threads 0 is outside \[1, 64\]$",
        ),
        (
            pb.CheckpointConfig(
                state_backend_options=pb.StateBackendOptions(compaction_style="fifo")
            ),
            r"compaction_style 'fifo' is not one of level, universal$",
        ),
    ],
)
def test_invalid_configs_are_refused(msg: pb.CheckpointConfig, match: str) -> None:
    _refused(match, lambda: wire.checkpoint_config_from_pb(msg))


def test_an_unknown_mode_number_is_refused_naming_the_field() -> None:
    msg = pb.CheckpointConfig()
    msg.mode = 99  # type: ignore[assignment]
    _refused(
        r"^checkpoint_config.mode 99 is not a known CheckpointMode$",
        lambda: wire.checkpoint_config_from_pb(msg),
    )


# --- the type itself -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"interval_ms": 1.5}, r"^interval_ms must be an integer, got 1.5$"),
        ({"interval_ms": True}, r"^interval_ms must be an integer"),
        ({"interval_ms": 5}, r"^interval_ms 5 is below the minimum of 10 ms: use 0"),
        ({"timeout_ms": 9}, r"^timeout_ms 9 is below the minimum of 10 ms$"),
        ({"retained": 0}, r"^retained must be >= 1, got 0$"),
        ({"max_concurrent": 0}, r"^max_concurrent must be >= 1, got 0$"),
        ({"mode": "aligned"}, r"^mode must be a CheckpointMode"),
        (
            {"mode": CheckpointMode.UNALIGNED, "max_concurrent": 2},
            r"^max_concurrent 2 needs aligned checkpoints",
        ),
        ({"storage_uri": "relative/dir"}, r"^storage_uri 'relative/dir' must be an absolute path"),
        ({"storage_uri": "gs://bucket/cp"}, r"^storage_uri 'gs://bucket/cp' uses the URI scheme"),
        ({"state_backend": "RocksDB"}, r"^state_backend 'RocksDB' is not one of heap, rocksdb$"),
        (
            {"inline_state_threshold_bytes": -1},
            r"^inline_state_threshold_bytes must be >= 0, got -1$",
        ),
        (
            {"inline_state_threshold_bytes": (1 << 20) + 1},
            r"^inline_state_threshold_bytes 1048577 is above the maximum of 1048576$",
        ),
    ],
)
def test_the_config_refuses_what_it_cannot_run_naming_the_field(
    fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidFieldError, match=match) as e:
        CheckpointConfig(**fields)
    assert str(e.value).startswith(e.value.field)


def test_replace_validates_too_and_the_defaults_are_valid() -> None:
    config = CheckpointConfig()
    assert (config.interval_ms, config.timeout_ms, config.retained) == (0, 600_000, 1)
    with pytest.raises(InvalidFieldError, match="interval_ms"):
        replace(config, interval_ms=-1)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"upload_threads": 0}, r"^upload_threads 0 is outside \[1, 64\]$"),
        ({"cache_entries": "many"}, r"^cache_entries must be an integer"),
        ({"compaction_style": "fifo"}, r"^compaction_style 'fifo' is not one of level, universal$"),
        ({"local_recovery": 1}, r"^local_recovery must be True or False"),
    ],
)
def test_the_state_backend_options_refuse_out_of_range_sizing(
    fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidFieldError, match=match):
        StateBackendOptions(**fields)


def test_backend_names_and_modes_are_read_as_users_write_them() -> None:
    assert parse_state_backend(" RocksDB ") == "rocksdb"
    assert parse_state_backend("") == "heap"
    _refused(
        r"^state_backend 'disk' is not one of heap, rocksdb$", lambda: parse_state_backend("disk")
    )
    assert parse_checkpoint_mode("unaligned") is CheckpointMode.UNALIGNED
    assert parse_checkpoint_mode(CheckpointMode.AT_LEAST_ONCE) is CheckpointMode.AT_LEAST_ONCE
    _refused(
        r"^mode must be one of 'aligned', 'unaligned', 'at_least_once', got 'exactly_once'$",
        lambda: parse_checkpoint_mode("exactly_once"),
    )


def test_a_field_error_says_where_it_sat() -> None:
    error = InvalidFieldError("upload_threads", "upload_threads 0 is outside [1, 64]")
    nested = error.within("state_backend_options").within("checkpoint_config")
    assert nested.field == "checkpoint_config.state_backend_options.upload_threads"
    assert (
        str(nested) == "checkpoint_config.state_backend_options.upload_threads 0 is outside [1, 64]"
    )
