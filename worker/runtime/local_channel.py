"""The in-process data channel: a producer side that puts frames straight into the consumer's
input channel, with the same credits and guarantees as over gRPC
(``snapflow.worker.runtime.exchange``).

No serialization: the consumer receives the very ``pyarrow.RecordBatch`` objects the producer
sent.
"""

from __future__ import annotations

from snapflow.worker.runtime.channel_errors import ChannelFailedError
from snapflow.worker.runtime.debloat import DebloatSettings
from snapflow.worker.runtime.input_channel import DEFAULT_BUFFERS_PER_CHANNEL, InputChannel
from snapflow.worker.runtime.output_channel import DEFAULT_OUTPUT_QUEUE, OutputChannel

__all__ = ["LocalChannel", "LocalOutputChannel"]


class LocalOutputChannel(OutputChannel):
    """Producer side of an in-process channel: frames go straight into the InputChannel."""

    def __init__(
        self,
        target: InputChannel,
        *,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        name: str = "",
        debloat: DebloatSettings | None = None,
    ) -> None:
        super().__init__(output_queue=output_queue, name=name or target.name, debloat=debloat)
        self.target = target
        target.on_release(self._on_consumer_released)
        self._credits = target.connect(self.add_credits)

    def _kick(self) -> None:
        target = self.target
        while (entry := self._take_nowait()) is not None:
            target.receive(entry[0])

    def abort(self, cause: BaseException | str = "producer aborted") -> None:
        super().abort(cause)
        if self._failure is not None:
            self.target.fail(self._failure)

    def _on_consumer_released(self, reason: str) -> None:
        self._fail(ChannelFailedError(f"channel {self.name}: consumer released it ({reason})"))


class LocalChannel:
    """An in-process channel: ``output`` (producer side) feeds ``input`` (consumer side).

    No serialization: the consumer receives the very ``pyarrow.RecordBatch`` objects the
    producer sent. Credits are enforced exactly as over gRPC.
    """

    def __init__(
        self,
        buffers_per_channel: int = DEFAULT_BUFFERS_PER_CHANNEL,
        *,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        name: str = "local",
        debloat: DebloatSettings | None = None,
    ) -> None:
        self.input = InputChannel(buffers_per_channel, name=name)
        self.output = LocalOutputChannel(
            self.input, output_queue=output_queue, name=name, debloat=debloat
        )
