"""The generated wire modules, (re)generated first when a source checkout's stubs are missing or stale.

Import the stubs from here rather than from ``recserve.v1`` / ``recserve.oip`` directly, so that a fresh
checkout works before anyone ran the build step.
"""

from google.protobuf import descriptor_pool

from recserve.server.transports.protogen import ensure_generated

ensure_generated()

from recserve.oip import grpc_predict_v2_pb2 as oip_pb2  # noqa: E402
from recserve.oip import grpc_predict_v2_pb2_grpc as oip_pb2_grpc  # noqa: E402
from recserve.v1 import predictor_pb2 as pb2  # noqa: E402
from recserve.v1 import predictor_pb2_grpc as pb2_grpc  # noqa: E402


def reflection_pool(*modules) -> descriptor_pool.DescriptorPool:
    """One pool holding the files of ``modules`` (generated ``_pb2`` modules) and their imports, for server
    reflection: the OIP descriptors live in a private pool (see protogen), the others in the default one."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        pool.AddSerializedFile(file.serialized_pb)
        added.add(file.name)

    for module in modules:
        add(module.DESCRIPTOR)
    return pool


PREDICTOR_SERVICE = pb2.DESCRIPTOR.services_by_name["Predictor"].full_name
ADMIN_SERVICE = pb2.DESCRIPTOR.services_by_name["Admin"].full_name
OIP_SERVICE = oip_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

__all__ = [
    "reflection_pool",
    "ADMIN_SERVICE",
    "OIP_SERVICE",
    "PREDICTOR_SERVICE",
    "oip_pb2",
    "oip_pb2_grpc",
    "pb2",
    "pb2_grpc",
]
