"""The Nexmark event model: people, auctions and bids as a pure, vectorised function of the
event id.

Written from the published model of the reference generator (Apache Beam's
``org.apache.beam.sdk.nexmark.sources.generator`` and its port in the Nexmark repository,
``nexmark-flink``); the facts carried over, the code is ours:

* **Kinds.** Event ``n`` is a person, an auction or a bid by ``n mod 50`` (the proportions
  1 : 3 : 46): offset 0 a person, 1..3 an auction, 4..49 a bid.
* **Ids.** The person of epoch ``e = n // 50`` has id ``1000 + e``; its auctions ids ``1000 +
  3e + 0..2``. An event's *last person* / *last auction* is the newest one generated at or
  before it (base 0).
* **Hot items.** A bid is for a hot auction (the first of the last block of 100 auctions) with
  probability 1 - 1/hot_auction_ratio (2: one half), otherwise for a random auction among the
  last ``num_in_flight_auctions`` (100) plus 10 not yet created. Its bidder is a hot bidder (the
  second person of the last block of 100) with probability 1 - 1/hot_bidders_ratio (4: three
  quarters), otherwise a random one of the last ``num_active_people`` (1000) plus 10 ahead. An
  auction's seller is hot (the first person of the block) with 1 - 1/hot_sellers_ratio.
* **Time.** Event ``n`` happens at ``base_time_ms + int(n * 1e6 / first_event_rate) // 1000``:
  event time advances with the inter-event delay, monotonically (no out-of-order groups, the
  reference's default). Watermarks ``dateTime - 4 s`` are the source's.
* **Fields.** Prices ``round(10 ** (6u) * 100)`` for a uniform ``u``; a reserve is the initial
  bid plus another price; categories 10..14; an auction expires 1 + uniform(2 * horizon) ms after
  it started, where the horizon is the time ``num_in_flight_auctions`` auctions take to be
  created. Names from 11 first and 9 last names, cities and states from short US lists, e-mails
  ``<3..6 letters>@<3..4 letters>.com``, credit cards four groups of 4 digits. Half of the bids
  come through 4 hot channels (Google, Facebook, Baidu, Apple, each with one url), the other
  half through ``channel-0..9999`` whose urls carry ``&channel_id=<|reverse bits of i|>`` 9 times
  in 10. ``extra`` pads an event to its kind's average size (person 200, auction 500, bid 100
  bytes), +-20 %.

Deviations, on purpose: every random choice is a hash of ``(seed, event id)`` (the reference
draws from ``java.util.Random``), so any event can be regenerated alone, in any batch, on any
split; a bidder id gets ``FIRST_PERSON_ID`` added once (the reference adds it twice in
``BidGenerator``, an apparent slip); the urls' random path segments come from the seed; and
``extra`` is a window of a fixed random-letter buffer (the reference too slices one reusable
random string), laid out so that a batch's ``extra`` column is that buffer, not a copy.

Vectorised: :func:`generate` turns a range of one kind's records into an Arrow record batch
with numpy and Arrow kernels, never a Python step per event.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError

__all__ = [
    "AUCTION",
    "AUCTION_SCHEMA",
    "BID",
    "BID_SCHEMA",
    "KINDS",
    "PERSON",
    "PERSON_SCHEMA",
    "SCHEMAS",
    "NexmarkConfig",
    "event_ids",
    "generate",
    "kind_count",
    "kind_of",
    "nexmark_events",
    "split_count",
    "split_ordinals",
    "timestamps",
]

PERSON, AUCTION, BID = "person", "auction", "bid"
KINDS = (PERSON, AUCTION, BID)

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_BLOCK = 100  # hot auctions, bidders and sellers are chosen in blocks of 100 ids
ID_LEAD = 10  # ids this far ahead of the last created may be chosen
CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland",
    "Bend", "Redmond", "Seattle", "Kent", "Cheyenne",
)  # fmt: skip
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")  # fmt: skip
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")  # fmt: skip

_I64 = pa.int64()
_STR = pa.string()

PERSON_SCHEMA = pa.schema(
    [
        ("id", _I64), ("name", _STR), ("emailAddress", _STR), ("creditCard", _STR),
        ("city", _STR), ("state", _STR), ("dateTime", _I64), ("extra", _STR),
    ]
)  # fmt: skip
AUCTION_SCHEMA = pa.schema(
    [
        ("id", _I64), ("itemName", _STR), ("description", _STR), ("initialBid", _I64),
        ("reserve", _I64), ("dateTime", _I64), ("expires", _I64), ("seller", _I64),
        ("category", _I64), ("extra", _STR),
    ]
)  # fmt: skip
BID_SCHEMA = pa.schema(
    [
        ("auction", _I64), ("bidder", _I64), ("price", _I64), ("channel", _STR),
        ("url", _STR), ("dateTime", _I64), ("extra", _STR),
    ]
)  # fmt: skip
SCHEMAS = {PERSON: PERSON_SCHEMA, AUCTION: AUCTION_SCHEMA, BID: BID_SCHEMA}
"""Every ``dateTime`` and ``expires`` is event time in epoch milliseconds (int64)."""

# 2024-01-01T00:00:00Z: a fixed base time, so that every run generates the same events.
DEFAULT_BASE_TIME_MS = 1_704_067_200_000

_U = np.uint64
_M64 = np.uint64(0xFFFFFFFF)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LN_1E6 = float(np.log(1e6))
_POOL_PERIOD = 1 << 20  # the random-letter buffer behind every ``extra`` repeats after 1 MiB


@dataclass(frozen=True)
class NexmarkConfig:
    """What the events depend on (Nexmark's generator options; the defaults are the
    reference's, but for ``first_event_rate``, its benchmark's 10 M events per second).

    ``first_event_rate``: events per second of *event time* (the inter-event delay is its
    inverse; how fast the source runs on the wall clock is the source's ``rate_per_s``).
    """

    first_event_rate: float = 10_000_000.0
    base_time_ms: int = DEFAULT_BASE_TIME_MS
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.first_event_rate > 0:
            raise InvalidArgumentError(
                f"first_event_rate must be > 0, got {self.first_event_rate!r}"
            )
        for name in (
            "person_proportion", "auction_proportion", "bid_proportion",
            "hot_auction_ratio", "hot_sellers_ratio", "hot_bidders_ratio",
            "num_in_flight_auctions", "num_active_people",
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def per_epoch(self, kind: str) -> int:
        """Events of ``kind`` in each epoch of ``total_proportion`` events."""
        return {
            PERSON: self.person_proportion,
            AUCTION: self.auction_proportion,
            BID: self.bid_proportion,
        }[_check_kind(kind)]

    def first_offset(self, kind: str) -> int:
        """The offset in an epoch of the first event of ``kind``."""
        return {PERSON: 0, AUCTION: self.person_proportion}.get(
            _check_kind(kind), self.person_proportion + self.auction_proportion
        )


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InvalidArgumentError(f"kind must be one of {KINDS}, got {kind!r}")
    return kind


# ---------------------------------------------------------------------------------------------
# Ids, kinds and time (scalar and vectorised: the model's arithmetic)
# ---------------------------------------------------------------------------------------------


def kind_of(config: NexmarkConfig, event_id: int) -> str:
    """The kind of event ``event_id``."""
    offset = event_id % config.total_proportion
    if offset < config.person_proportion:
        return PERSON
    if offset < config.person_proportion + config.auction_proportion:
        return AUCTION
    return BID


def kind_count(config: NexmarkConfig, kind: str, num_events: int) -> int:
    """How many of the events ``0 .. num_events - 1`` are of ``kind``."""
    epochs, rest = divmod(num_events, config.total_proportion)
    k = config.per_epoch(kind)
    return epochs * k + min(k, max(0, rest - config.first_offset(kind)))


def event_ids(
    config: NexmarkConfig, kind: str, ordinals: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The event ids of the ``ordinals``-th events of ``kind`` (from 0)."""
    k = config.per_epoch(kind)
    result: npt.NDArray[np.int64] = (
        (ordinals // k) * config.total_proportion + config.first_offset(kind) + ordinals % k
    )
    return result


def split_ordinals(
    config: NexmarkConfig,
    kind: str,
    start: int,
    n: int,
    split: int,
    num_splits: int,
    block_epochs: int,
) -> npt.NDArray[np.int64]:
    """The kind-ordinals of records ``start .. start + n - 1`` of ``split`` of ``num_splits``:
    the events are cut into blocks of ``block_epochs`` epochs dealt round-robin to the splits,
    so that all splits advance through event time together (a block apart at most) and their
    union is the one serial stream of the model."""
    block = block_epochs * config.per_epoch(kind)
    i = np.arange(start, start + n, dtype=np.int64)
    result: npt.NDArray[np.int64] = ((i // block) * num_splits + split) * block + i % block
    return result


def split_count(
    config: NexmarkConfig,
    kind: str,
    num_events: int,
    split: int,
    num_splits: int,
    block_epochs: int,
) -> int:
    """How many records of ``kind`` ``split`` owns among the events ``0 .. num_events - 1``."""
    block = block_epochs * config.per_epoch(kind)
    full, rest = divmod(kind_count(config, kind, num_events), block)
    owned = full // num_splits + (1 if split < full % num_splits else 0)
    return owned * block + (rest if full % num_splits == split else 0)


def timestamps(config: NexmarkConfig, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The event time of each event id (epoch ms): ``base + int(id * delay_us) // 1000``."""
    delay_us = 1e6 / config.first_event_rate
    us = (ids.astype(np.float64) * delay_us).astype(np.int64)
    result: npt.NDArray[np.int64] = us // 1000 + config.base_time_ms
    return result


def _last_person(config: NexmarkConfig, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The newest person id (base 0) at each event: the event's own for a person."""
    total, pp = config.total_proportion, config.person_proportion
    epoch, offset = ids // total, ids % total
    result: npt.NDArray[np.int64] = epoch * pp + np.minimum(offset, pp - 1)
    return result


def _last_auction(config: NexmarkConfig, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The newest auction id (base 0) at each event: the event's own for an auction (-1 before
    the first auction)."""
    total, pp, ap = config.total_proportion, config.person_proportion, config.auction_proportion
    epoch, offset = ids // total, ids % total
    in_epoch = np.clip(offset - pp, -1, ap - 1)  # -1: a person, before this epoch's auctions
    result: npt.NDArray[np.int64] = np.where(
        in_epoch < 0, (epoch - 1) * ap + (ap - 1), epoch * ap + in_epoch
    )
    return result


# ---------------------------------------------------------------------------------------------
# Randomness: hashes of (seed, event id, stream)
# ---------------------------------------------------------------------------------------------


def _fmix(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer, in place (uint64 arithmetic wraps)."""
    h ^= h >> _U(33)
    h *= _C1
    h ^= h >> _U(33)
    h *= _C2
    h ^= h >> _U(33)
    return h


def _hash(config: NexmarkConfig, ids: npt.NDArray[np.int64], stream: int) -> npt.NDArray[np.uint64]:
    """64 random bits per event id, one independent draw per ``stream``."""
    salt = _U((config.seed * 0x2545F4914F6CDD1D + stream * 0x9E3779B97F4A7C15) % (1 << 64))
    h = ids.astype(np.uint64)
    h *= _GOLDEN
    h += salt
    return _fmix(h)


def _below(
    bits: npt.NDArray[np.uint64], bound: npt.NDArray[np.int64] | int
) -> npt.NDArray[np.int64]:
    """Uniform integers in ``[0, bound)`` from the low 32 of ``bits`` (multiply-shift)."""
    low = bits & _M64
    scaled = (low * np.asarray(bound, dtype=np.uint64)) >> _U(32)
    return scaled.astype(np.int64)


def _unit(bits: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Uniform doubles in ``[0, 1)`` from the high 53 of ``bits``."""
    return (bits >> _U(11)).astype(np.float64) * (1.0 / (1 << 53))


def _prices(bits: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """``round(10 ** (6u) * 100)``: cents from 1 dollar to 1 M dollars, log-uniform."""
    x = np.exp(_unit(bits) * _LN_1E6)
    x *= 100.0
    x += 0.5
    return x.astype(np.int64)  # floor: x > 0


def _person_choice(
    last: npt.NDArray[np.int64],
    bits: npt.NDArray[np.uint64],
    hot_ratio: int,
    hot_slot: int,
    config: NexmarkConfig,
) -> npt.NDArray[np.int64]:
    """A person id (with ``FIRST_PERSON_ID``) at events whose newest person is ``last``: hot
    (slot ``hot_slot`` of the newest block of 100) with probability 1 - 1/hot_ratio, else one of
    the active people or a few ahead."""
    active = np.minimum(last + 1, config.num_active_people)
    result: npt.NDArray[np.int64] = np.where(
        _below(bits >> _U(32), hot_ratio) > 0,
        last - last % HOT_BLOCK + hot_slot,
        last + 1 - active + _below(bits, active + ID_LEAD),
    )
    result += FIRST_PERSON_ID
    return result


# ---------------------------------------------------------------------------------------------
# Strings
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _letters(seed: int, alphabet: bytes, length: int) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    table = np.frombuffer(alphabet, dtype=np.uint8)
    result: npt.NDArray[np.uint8] = table[rng.integers(0, len(table), length)]
    return result


class _Pool:
    """The periodic random-letter buffer ``extra`` columns are windows of (grown on demand)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.period = _letters(seed, b"abcdefghijklmnopqrstuvwxyz", _POOL_PERIOD)
        self.buffer = pa.py_buffer(np.concatenate([self.period, self.period]).tobytes())

    def window(self, start: int, length: int) -> pa.Buffer:
        """``length`` bytes of the infinite periodic buffer from ``start`` (mod the period)."""
        start %= _POOL_PERIOD
        if start + length > self.buffer.size:
            reps = (start + length) // _POOL_PERIOD + 2
            self.buffer = pa.py_buffer(np.tile(self.period, reps).tobytes())
        return self.buffer.slice(start, length)


@functools.lru_cache(maxsize=8)
def _pool(seed: int) -> _Pool:
    return _Pool(seed)


def _extras(
    config: NexmarkConfig, ordinals: npt.NDArray[np.int64], avg: int, stream: int
) -> pa.Array:
    """The ``extra`` of the kind-ordinals ``ordinals`` (ascending): record ``b`` spans
    ``[s(b), s(b + 1))`` of the pool, ``s(b) = b * avg + jitter(b)`` with a jitter below 40 %
    of ``avg`` (lengths ``avg`` +-20 %), so that a run of consecutive ordinals is one window of
    the pool, not a copy (a batch of a split is one run per block it touches)."""
    n = len(ordinals)
    if n == 0:
        return pa.array([], _STR)
    breaks = np.flatnonzero(np.diff(ordinals) != 1) + 1
    if len(breaks):
        bounds = [0, *breaks.tolist(), n]
        return pa.concat_arrays(
            [_extras(config, ordinals[lo:hi], avg, stream) for lo, hi in itertools.pairwise(bounds)]
        )
    span = max(1, (avg * 2) // 5)
    edges = np.arange(int(ordinals[0]), int(ordinals[0]) + n + 1, dtype=np.int64)
    starts = edges * avg + _below(_hash(config, edges, stream), span) + stream * 65_537
    base = int(starts[0])
    offsets = (starts - base).astype(np.int32)
    data = _pool(config.seed).window(base, int(offsets[-1]))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), data)


def _random_strings(
    config: NexmarkConfig, bits: npt.NDArray[np.uint64], max_length: int, special: int = 0x20
) -> pa.Array:
    """The reference's ``nextString``: 3 .. max_length - 1 letters, one in 13 being
    ``special`` (a space: trimmed at both ends), as an Arrow string array."""
    n = len(bits)
    lengths = 3 + _below(bits, max_length - 3)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    alphabet = b"abcdefghijklmnopqrstuvwxyz" * 12 + bytes([special]) * 26  # 1 in 13
    pool = _letters(config.seed + 1, alphabet, _POOL_PERIOD)
    starts = (bits >> _U(32)).astype(np.int64) % (_POOL_PERIOD - max_length)
    total = int(offsets[-1])
    gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    data = pa.py_buffer(pool[gather].tobytes())
    arr = pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), data)
    if special == 0x20:
        return pc.utf8_trim(arr, " ")
    return pc.utf8_trim(arr, chr(special))


@functools.lru_cache(maxsize=8)
def _channel_tables(seed: int) -> tuple[pa.Array, pa.Array]:
    """Channel names and their urls: index 0..3 the hot channels, 4 + i ``channel-i``."""
    rng = np.random.default_rng(seed + 2)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def segment() -> str:
        length = 3 + int(rng.integers(0, 2))
        return "".join(letters[int(c)] if c < 26 else "_" for c in rng.integers(0, 28, length))

    def base_url() -> str:
        return f"https://www.nexmark.com/{segment()}/{segment()}/{segment()}/item.htm?query=1"

    names = list(HOT_CHANNELS)
    urls = [base_url() for _ in HOT_CHANNELS]
    for i in range(CHANNELS_NUMBER):
        url = base_url()
        if rng.integers(0, 10) > 0:
            reversed_bits = int(f"{i:032b}"[::-1], 2)
            signed = reversed_bits - (1 << 32) if reversed_bits >= 1 << 31 else reversed_bits
            url += f"&channel_id={abs(signed)}"
        names.append(f"channel-{i}")
        urls.append(url)
    return pa.array(names, _STR), pa.array(urls, _STR)


def _credit_cards(bits: npt.NDArray[np.uint64], more: npt.NDArray[np.uint64]) -> pa.Array:
    groups = [
        pc.utf8_lpad(pa.array(_below(b, 10_000)).cast(_STR), 4, "0")
        for b in (bits, bits >> _U(32), more, more >> _U(32))
    ]
    return pc.binary_join_element_wise(*groups, " ")


# ---------------------------------------------------------------------------------------------
# The three kinds
# ---------------------------------------------------------------------------------------------


def _bids(
    config: NexmarkConfig, ids: npt.NDArray[np.int64], ordinals: npt.NDArray[np.int64]
) -> pa.RecordBatch:
    # A bid comes after its epoch's person and auctions: the newest of each is the epoch's last.
    epoch = ordinals // config.bid_proportion
    last_auction = epoch * config.auction_proportion + (config.auction_proportion - 1)
    last_person = epoch * config.person_proportion + (config.person_proportion - 1)
    h1, h2 = _hash(config, ids, 1), _hash(config, ids, 2)
    in_flight = np.minimum(last_auction, config.num_in_flight_auctions)
    auction = np.where(
        _below(h1 >> _U(32), config.hot_auction_ratio) > 0,
        last_auction - last_auction % HOT_BLOCK,
        last_auction - in_flight + _below(h1, in_flight + 1 + ID_LEAD),
    )
    auction += FIRST_AUCTION_ID
    bidder = _person_choice(last_person, h2, config.hot_bidders_ratio, 1, config)
    # Channel index: 0..3 a hot channel (with probability 1/2), else 4 + one of 10,000.
    h3 = _hash(config, ids, 5)
    hot_channel = _below(h3 >> _U(32), 2 * len(HOT_CHANNELS))  # 0..3 hot, 4..7 not
    channel_index = pa.array(
        np.where(
            hot_channel < len(HOT_CHANNELS),
            hot_channel,
            len(HOT_CHANNELS) + _below(h3, CHANNELS_NUMBER),
        )
    )
    names, urls = _channel_tables(config.seed)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(auction),
            pa.array(bidder),
            pa.array(_prices(_hash(config, ids, 3))),
            names.take(channel_index),
            urls.take(channel_index),
            pa.array(timestamps(config, ids)),
            _extras(config, ordinals, config.avg_bid_byte_size - 32, 4),
        ],
        schema=BID_SCHEMA,
    )


def _auctions(
    config: NexmarkConfig, ids: npt.NDArray[np.int64], ordinals: npt.NDArray[np.int64]
) -> pa.RecordBatch:
    h1, h2 = _hash(config, ids, 11), _hash(config, ids, 12)
    ts = timestamps(config, ids)
    auction_id = _last_auction(config, ids) + FIRST_AUCTION_ID
    initial = _prices(_hash(config, ids, 13))
    reserve = initial + _prices(_hash(config, ids, 14))
    ahead = (config.num_in_flight_auctions * config.total_proportion) // config.auction_proportion
    horizon = timestamps(config, ids + ahead) - ts
    expires = ts + 1 + _below(h1, np.maximum(horizon * 2, 1))
    seller = _person_choice(_last_person(config, ids), h2, config.hot_sellers_ratio, 0, config)
    category = FIRST_CATEGORY_ID + _below(h1 >> _U(32), NUM_CATEGORIES)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(auction_id),
            _random_strings(config, _hash(config, ids, 15), 20),
            _random_strings(config, _hash(config, ids, 16), 100),
            pa.array(initial),
            pa.array(reserve),
            pa.array(ts),
            pa.array(expires),
            pa.array(seller),
            pa.array(category),
            _extras(config, ordinals, config.avg_auction_byte_size - 108, 17),
        ],
        schema=AUCTION_SCHEMA,
    )


@functools.lru_cache(maxsize=1)
def _person_tables() -> tuple[pa.Array, pa.Array, pa.Array]:
    names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    return pa.array(names, _STR), pa.array(US_CITIES, _STR), pa.array(US_STATES, _STR)


def _people(
    config: NexmarkConfig, ids: npt.NDArray[np.int64], ordinals: npt.NDArray[np.int64]
) -> pa.RecordBatch:
    h1, h2 = _hash(config, ids, 21), _hash(config, ids, 22)
    names, cities, states = _person_tables()
    domain = pc.binary_join_element_wise(
        _random_strings(config, _hash(config, ids, 24), 5), pa.scalar(".com"), ""
    )
    email = pc.binary_join_element_wise(
        _random_strings(config, _hash(config, ids, 23), 7), domain, "@"
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(_last_person(config, ids) + FIRST_PERSON_ID),
            names.take(pa.array(_below(h1, len(names)))),
            email,
            _credit_cards(h2, _hash(config, ids, 26)),
            cities.take(pa.array(_below(h1 >> _U(32), len(US_CITIES)))),
            states.take(pa.array(_below(_hash(config, ids, 27), len(US_STATES)))),
            pa.array(timestamps(config, ids)),
            _extras(config, ordinals, config.avg_person_byte_size - 64, 25),
        ],
        schema=PERSON_SCHEMA,
    )


_GENERATORS = {PERSON: _people, AUCTION: _auctions, BID: _bids}


def generate(config: NexmarkConfig, kind: str, ordinals: npt.NDArray[np.int64]) -> pa.RecordBatch:
    """The events of ``kind`` with these kind-ordinals (ascending; see :func:`split_ordinals`)
    as a record batch of ``SCHEMAS[kind]``."""
    if len(ordinals) == 0:
        return pa.RecordBatch.from_pylist([], schema=SCHEMAS[_check_kind(kind)])
    return _GENERATORS[kind](config, event_ids(config, kind, ordinals), ordinals)


def nexmark_events(config: NexmarkConfig, kind: str, num_events: int) -> pa.Table:
    """The events of ``kind`` among the first ``num_events`` events, in event-id order (what a
    batch job compares a streaming job with)."""
    count = kind_count(config, kind, num_events)
    step = 1 << 16
    batches = [
        generate(config, kind, np.arange(lo, min(count, lo + step), dtype=np.int64))
        for lo in range(0, count, step)
    ]
    return pa.Table.from_batches(batches, schema=SCHEMAS[kind])
