"""The internal gRPC plane through real processes: every call needs the shared token, health stays open,
admin calls still need the admin key, and `bae run` generates the token and keeps the ports on loopback."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bae.common import error_codes
from bae.common.errors import Unauthenticated
from bae.common.internal import TOKEN_METADATA, InternalPlane
from bae.common.protos import admin_api_pb2, edge_pb2, runner_pb2, runner_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc, session_pb2_grpc
from bae.launcher.stack import Stack
from testkit import ROOT
from testkit.ports import free_port
from testkit.stack import launch_stack, stack_env

pytestmark = pytest.mark.stack

WRONG = secrets.token_hex(32)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = launch_stack(tmp_path_factory.mktemp("plane"))
    yield running
    running.close()


def calls(stack) -> dict:
    """One call per internal service: (address, stub class, method, request)."""
    settings = stack.stack.settings
    return {
        "session": (settings.session_grpc_addr, session_pb2_grpc.SessionServiceStub, "ListProfiles",
                    admin_api_pb2.ListProfilesRequest(credential=edge_pb2.Credential(
                        authorization=f"Bearer {stack.admin_key}", present=True))),
        "runner": (settings.runner_grpc_addr, runner_pb2_grpc.RunnerStub, "RunSteps", [runner_pb2.StepCalls(calls=[
                   runner_pb2.StepCall(step_id=1, start=runner_pb2.StepStart(
                       request=runner_pb2.StepRequest(primary_provider="none")))])]),
        "sandbox": (settings.sandbox_grpc_addrs[0], sandbox_pb2_grpc.SandboxStub, "List", sandbox_pb2.ListRequest()),
    }


async def invoke(address: str, stub_class, method: str, request, metadata=()) -> grpc.StatusCode:
    """The status a call ends with (OK when it completes)."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = getattr(stub_class(channel), method)(request, metadata=metadata, timeout=10)
        try:
            if hasattr(call, "read"):
                async for _ in call:
                    pass
            else:
                await call
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("service", ["session", "runner", "sandbox"])
async def test_a_call_without_the_internal_token_is_refused(stack, service):
    address, stub_class, method, request = calls(stack)[service]
    token = stack.stack.env["BAE_INTERNAL_TOKEN"]
    assert await invoke(address, stub_class, method, request) == grpc.StatusCode.UNAUTHENTICATED
    assert await invoke(address, stub_class, method, request, ((TOKEN_METADATA, WRONG),)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert await invoke(address, stub_class, method, request, ((TOKEN_METADATA, token[:-1]),)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # With the token the call gets through to the service (which may still refuse it on its own terms).
    assert await invoke(address, stub_class, method, request, ((TOKEN_METADATA, token),)) != (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # Health checks stay open, for probes.
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_admin_calls_still_need_the_admin_key(stack):
    # The internal token proves "one of our services", not an administrator.
    plane = InternalPlane(stack.stack.env["BAE_INTERNAL_TOKEN"], keepalive=30.0)
    address = stack.stack.settings.session_grpc_addr
    profile = stack.create_profile("plane")
    client_key = stack.create_key(profile["id"])["key"]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = session_pb2_grpc.SessionServiceStub(channel)
        for authorization in (None, f"Bearer {client_key}", f"Bearer {stack.stack.env['BAE_INTERNAL_TOKEN']}"):
            credential = edge_pb2.Credential(authorization=authorization or "", present=authorization is not None)
            requests = {
                "CreateProfile": admin_api_pb2.CreateProfileRequest(
                    credential=credential, body=admin_api_pb2.ProfileBody(name="sneaky", primary_provider="mock")),
                "ListKeys": admin_api_pb2.ListKeysRequest(credential=credential),
                "GetConfig": admin_api_pb2.AdminRequest(credential=credential),
            }
            for method, request in requests.items():
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await getattr(stub, method)(request, timeout=10, metadata=[plane.token_metadata])
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert isinstance(error_codes.raised_by(caught.value), Unauthenticated)
    names = [item["name"] for item in stack.admin.get("/admin/v1/profiles").json()["items"]]
    assert "sneaky" not in names


@pytest.mark.parametrize("module", ["bae.services.session", "bae.services.runner", "bae.services.sandbox", "bae.services.gateway"])
@pytest.mark.parametrize("token", ["", "short-token"])
def test_a_service_without_a_usable_token_does_not_start(tmp_path, module, token):
    env = stack_env(tmp_path, BAE_INTERNAL_TOKEN=token, BAE_SANDBOX_LISTEN_ADDR=f"127.0.0.1:{free_port()}")
    started = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 2, started.stderr
    assert "BAE_INTERNAL_TOKEN" in started.stderr


def test_the_stack_launcher_generates_a_token_for_its_services(tmp_path):
    env = stack_env(tmp_path)
    del env["BAE_INTERNAL_TOKEN"]
    stack = Stack(env=dict(env))
    generated = stack.env["BAE_INTERNAL_TOKEN"]
    assert len(generated) == 64 and generated != Stack(env=dict(env)).env["BAE_INTERNAL_TOKEN"]
    given = secrets.token_hex(32)
    assert Stack(env={**env, "BAE_INTERNAL_TOKEN": given}).env["BAE_INTERNAL_TOKEN"] == given


@pytest.mark.parametrize("variable", ["BAE_SESSION_GRPC_ADDR", "BAE_RUNNER_GRPC_ADDR", "BAE_SANDBOX_GRPC_ADDRS"])
def test_bae_run_keeps_the_internal_ports_on_loopback(tmp_path, variable):
    env = stack_env(tmp_path, **{variable: f"0.0.0.0:{free_port()}"})
    started = subprocess.run([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert started.returncode == 2
    assert "internal gRPC addresses must be loopback" in started.stderr


def test_bae_run_needs_no_token_setting(tmp_path):
    # `bae run` (what `make run` runs) with no BAE_INTERNAL_TOKEN at all: the stack comes up and answers.
    env = stack_env(tmp_path)
    del env["BAE_INTERNAL_TOKEN"]
    process = subprocess.Popen([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        output = ""
        for line in process.stdout:
            output += line
            if "Press Ctrl-C to stop." in line or process.poll() is not None:
                break
        assert "BAE is running." in output, output
        key = (tmp_path / "admin-key.pem").read_text().strip()
        answer = httpx.get(f"http://{env['BAE_ADMIN_ADDR']}/admin/v1/profiles",
                           headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert answer.status_code == 200, answer.text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
