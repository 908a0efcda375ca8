"""The chain seen from Python's grpcio, a client nobody here wrote.

For each gRPC port named in the configuration: the health service's answer and the services that
v1alpha reflection lists (the version older clients ask). Then a CreateOrder through the gateway
from stubs generated from proto/ at run time, with a Python `timeout=`, and the deadline ledger
the gateway answers with. Prints one JSON report on stdout; the end-to-end test judges it.

Usage: python3 grpc_interop.py CONFIG.json
"""

import importlib
import json
import sys
import tempfile
from importlib import resources

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_tools import protoc

WAIT_S = 10


def read(path):
    with open(path, "rb") as file:
        return file.read()


def channel(port, operator):
    """Plain text, or mutual TLS with the operator's certificate when the port names its service."""
    if port.get("tls_name") is None:
        return grpc.insecure_channel(port["address"])
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(operator["ca"]),
        private_key=read(operator["key"]),
        certificate_chain=read(operator["cert"]),
    )
    return grpc.secure_channel(port["address"], credentials, options=[("grpc.ssl_target_name_override", port["tls_name"])])


def health(chan):
    answer = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=""), timeout=WAIT_S)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def reflected_services(chan):
    stub = reflection_pb2_grpc.ServerReflectionStub(chan)
    answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=WAIT_S)
    return sorted(service.name for answer in answers for service in answer.list_services_response.service)


def create_order(config):
    """Generates the gateway's stubs from proto/ and creates an order with `timeout=`."""
    with tempfile.TemporaryDirectory() as generated:
        well_known = str(resources.files("grpc_tools") / "_proto")
        status = protoc.main([
            "grpc_tools.protoc", f"-I{config['proto_dir']}", f"-I{well_known}",
            f"--python_out={generated}", f"--grpc_python_out={generated}",
            "common/v1/common.proto", "gateway/v1/gateway.proto",
        ])
        if status != 0:
            raise SystemExit(f"protoc failed with {status}")
        sys.path.insert(0, generated)
        common = importlib.import_module("common.v1.common_pb2")
        gateway = importlib.import_module("gateway.v1.gateway_pb2_grpc")
        order = common.CreateOrderRequest(
            customer_id="c-1", items=[common.LineItem(sku="sku-1", quantity=2)], amount_minor=1299, currency="EUR"
        )
        metadata = [("authorization", f"Bearer {config['api_key']}"), ("idempotency-key", config["idempotency_key"])]
        with grpc.insecure_channel(config["gateway"]) as chan:
            answer, call = gateway.GatewayStub(chan).CreateOrder.with_call(order, timeout=config["timeout_s"], metadata=metadata)
        answered = dict(call.initial_metadata()) | dict(call.trailing_metadata())
        return {"status": common.OrderStatus.Name(answer.status), "ledger": answered.get("x-deadline-ledger")}


def main():
    config = json.loads(read(sys.argv[1]))
    ports = {}
    for name, port in config["ports"].items():
        with channel(port, config["operator"]) as chan:
            ports[name] = {"health": health(chan), "services": reflected_services(chan)}
    print(json.dumps({"ports": ports, "order": create_order(config)}))


if __name__ == "__main__":
    main()
