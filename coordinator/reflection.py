"""gRPC server reflection, v1 and v1alpha, from grpcio-reflection's own servicer.

grpcio-reflection (every release up to the one pinned) serves only
``grpc.reflection.v1alpha.ServerReflection`` (grpc/grpc issue 38576); ``grpcurl``, Postman and
the reflection clients of Java and Go ask for ``grpc.reflection.v1.ServerReflection`` first.
The v1 protocol is v1alpha renamed: the same messages with the same field numbers (compare
``grpc/reflection/v1/reflection.proto`` with ``v1alpha``), so the bytes on the wire are the same.
So the v1 service here is grpcio-reflection's servicer registered a second time under the v1
name, reading and writing its v1alpha messages; and so that a client can describe the v1
service itself, the v1 file descriptor (v1alpha's, with the package renamed) is added to the
descriptor pool. When grpcio-reflection ships v1, use its ``enable_server_reflection``.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

V1ALPHA_SERVICE_NAME = v1alpha.DESCRIPTOR.services_by_name["ServerReflection"].full_name
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1_FILE_NAME = "grpc/reflection/v1/reflection.proto"


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """The v1 reflection.proto as a descriptor: v1alpha's, with the package renamed."""
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    proto.name = V1_FILE_NAME
    proto.package = V1_PACKAGE
    proto.options.Clear()
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = f".{V1_PACKAGE}." + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = f".{V1_PACKAGE}." + method.input_type[len(old) :]
            method.output_type = f".{V1_PACKAGE}." + method.output_type[len(old) :]
    return proto


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindFileByName(V1_FILE_NAME)
    except KeyError:
        pool.Add(_v1_file())


def enable_server_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha on ``server`` for ``service_names`` (both reflection
    services are added to the list)."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = [*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME]
    servicer = ReflectionServicer(names, pool=pool)
    v1alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha.ServerReflectionRequest.FromString,
        response_serializer=v1alpha.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": v1}),)
    )
