"""What the dashboard's JSON API and the per-job metrics show, built from the views the gRPC
service returns (``JobRunner.job_info``/``task_infos``/``stats_pb``/``details_pb``, i.e.
``coordinator/job_views.py`` and ``coordinator/checkpoint_stats.py``) and the job's history
(``coordinator/job_history.py``). Nothing here changes state, and nothing here is a second
copy of a view: protos are turned into JSON (field names as in the .proto files, int64 as
JSON numbers), and the exception history, which no proto carries, is added.

Call these on the coordinator's event loop (the HTTP server runs there): the jobs' state
belongs to it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from snapflow.coordinator import convert
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.job_runner import JobRunner
from snapflow.coordinator.metrics import JobSample
from snapflow.errors import InvalidArgumentError

_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)

MAX_CHECKPOINT_ID_CHARS = 20  # int64 max has 19 digits


def to_json(message: Message) -> dict[str, Any]:
    """A proto as a JSON object: proto field names, every field present, enums by name,
    int64 as numbers (the proto3 JSON mapping writes them as strings)."""
    out = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message.DESCRIPTOR, out)
    return out


def _int64_as_numbers(descriptor: Any, obj: dict[str, Any]) -> None:
    # ``descriptor``: a message Descriptor (pure-Python or upb)
    for field in descriptor.fields:
        value = obj.get(field.name)
        if value is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                continue  # no map of int64 in our protos
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(field.message_type, item)
        elif field.type in _INT64:
            obj[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)


def parse_checkpoint_id(text: str) -> int:
    """A checkpoint id from a URL path segment."""
    if not text.isdigit() or len(text) > MAX_CHECKPOINT_ID_CHARS:
        raise InvalidArgumentError(
            f"checkpoint id {text[:MAX_CHECKPOINT_ID_CHARS]!r} is not a positive integer"
        )
    return convert.checkpoint_id_from_pb(int(text))


def runner(manager: JobManager, job_id: str) -> JobRunner:
    """The job's runner; the same checks and errors as the gRPC service."""
    return manager.runner(convert.parse_job_id(job_id))


def jobs(manager: JobManager) -> dict[str, Any]:
    """All jobs as ListJobs returns them (summaries: no graph), oldest first."""
    runners = sorted(manager.jobs.values(), key=lambda r: (r.record.created_at_ms, r.job_id))
    out = []
    for r in runners:
        info = r.job_info()
        info.ClearField("graph")
        out.append(to_json(info))
    return {"epoch": manager.epoch, "fenced": manager.fenced, "jobs": out}


def job(r: JobRunner, now_ms: int) -> dict[str, Any]:
    """One job: GetJob (with the graph, without operator payloads), ListTasks, the exception
    history and the uptime."""
    history = r.watchers.history
    return {
        "job": to_json(r.job_info()),
        "tasks": [to_json(t) for t in r.task_infos()],
        "uptime_ms": history.uptime_ms(now_ms, r.execution.state),
        "exceptions": {
            "entries": [
                {
                    "timestamp_ms": e.timestamp_ms,
                    "task": to_json(convert.attempt_to_pb(e.task)) if e.task else None,
                    "message": e.message,
                }
                for e in history.exceptions()
            ],
            "truncated": history.truncated,
        },
    }


def checkpoints(r: JobRunner) -> dict[str, Any]:
    """GetCheckpointStats with every remembered checkpoint (completed ones that retention or
    a disposal removed since are marked ``discarded`` by the view), the checkpoint
    configuration and the ids retained now."""
    return {
        "stats": to_json(r.stats_pb(0)),
        "config": to_json(r.job_info().checkpoint_config),
        "retained_ids": r.core.retained_ids(),
    }


def checkpoint_details(r: JobRunner, checkpoint_id: int) -> dict[str, Any]:
    """GetCheckpointDetails: one checkpoint with its per-subtask acknowledgements."""
    return to_json(r.details_pb(checkpoint_id))


# --- per-job metrics ----------------------------------------------------------------------


def job_samples(manager: JobManager) -> list[JobSample]:
    """The per-job metric values of every job (``snapflow_job_*``), from the same views."""
    now_ms = manager.clock()
    samples = []
    for r in list(manager.jobs.values()):
        stats = r.stats_pb(1)
        latest = stats.latest_completed if stats.HasField("latest_completed") else None
        restore = stats.latest_restore if stats.HasField("latest_restore") else None
        uptime_ms = r.watchers.history.uptime_ms(now_ms, r.execution.state)
        samples.append(
            JobSample(
                job_id=r.job_id,
                last_completed_checkpoint_id=latest.checkpoint_id if latest else -1,
                last_checkpoint_duration_s=latest.end_to_end_duration_ms / 1000 if latest else -1,
                last_checkpoint_size_bytes=latest.state_size_bytes if latest else -1,
                last_restore_timestamp_s=restore.restore_timestamp_ms / 1000 if restore else -1,
                restarts=r.execution.restarts,
                uptime_s=uptime_ms / 1000 if uptime_ms >= 0 else -1,
            )
        )
    return samples
