"""Address lists and the order in which a leader channel tries coordinators
(snapflow/leader_channel.py); the channels themselves run against real coordinators in
tests/coordinator/test_leadership_redis.py and test_leadership_failover.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from snapflow.errors import ConfigError
from snapflow.leader_channel import (
    AioLeaderChannel,
    LeaderTracker,
    SyncLeaderChannel,
    aio_leader_channel,
    parse_addresses,
    sync_leader_channel,
)


def test_addresses_are_parsed_in_order_without_duplicates() -> None:
    assert parse_addresses("a:1") == ("a:1",)
    assert parse_addresses(" a:1, b:2 ,a:1,, [::1]:3") == ("a:1", "b:2", "[::1]:3")
    for bad, message in [
        ("", "no coordinator address"),
        (" , ", "no coordinator address"),
        ("a", "not host:port"),
        ("a:1,b:x", "not host:port"),
        (":5", "not host:port"),
        ("a:70000", "not host:port"),
        ("a:\u00b2", "not host:port"),  # a digit to str.isdigit, not to int()
        ("a:" + "9" * 5000, "not host:port"),  # beyond int()'s digit limit
        (",".join(f"h:{p}" for p in range(1, 18)), "at most 16"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_addresses(bad)


def test_the_tracker_tries_the_last_answering_then_the_named_leader_then_the_rest() -> None:
    tracker = LeaderTracker(("a:1", "b:2", "c:3"))
    assert tracker.next_address([]) == "a:1"
    assert tracker.next_address(["a:1"]) == "b:2"
    assert tracker.next_address(["a:1"], hint="c:3") == "c:3"  # a standby named the leader
    assert tracker.next_address(["a:1", "c:3"], hint="c:3") == "b:2"  # tried already
    assert tracker.next_address(["a:1"], hint="z:9") == "b:2"  # not in the list: ignored
    assert tracker.next_address(["a:1", "b:2", "c:3"]) is None  # each at most once
    tracker.answered("c:3")
    assert tracker.current == "c:3"
    assert tracker.next_address([]) == "c:3"
    assert tracker.next_address(["c:3"]) == "a:1"  # the rest of the ring
    tracker.answered("z:9")  # unknown: ignored
    assert tracker.current == "c:3"


def test_one_address_is_a_plain_channel_several_a_leader_channel() -> None:
    with sync_leader_channel("127.0.0.1:1") as one:
        assert not isinstance(one, SyncLeaderChannel)
    with sync_leader_channel("127.0.0.1:1,127.0.0.1:2") as several:
        assert isinstance(several, SyncLeaderChannel)
        assert set(several.channels) == {"127.0.0.1:1", "127.0.0.1:2"}
        # nothing listens on either: one UNAVAILABLE after trying both
        call = several.unary_unary("/snapflow.v1.CoordinatorService/ListJobs")
        with pytest.raises(grpc.RpcError) as error:
            call(b"", timeout=5)
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE


async def _aio_kinds() -> tuple[bool, bool]:
    one = aio_leader_channel("127.0.0.1:1")
    several = aio_leader_channel(["127.0.0.1:1", "127.0.0.1:2"])
    try:
        return isinstance(one, AioLeaderChannel), isinstance(several, AioLeaderChannel)
    finally:
        await one.close()
        await several.close()


def test_aio_channels_too() -> None:
    assert asyncio.run(_aio_kinds()) == (False, True)
