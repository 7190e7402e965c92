"""The vault task as a NeMo Gym environment (``nemo-gym``): a resources server with two tools
(``POST /read_code``, ``POST /open_box``, answering in text), ``/seed_session`` taking the
row's box and code, and
``/verify`` whose reward is 0.1 for calling ``read_code``, 0.1 for reading the task's box with
it, and 1 for opening the box; and an agent server whose ``/run`` does
what NeMo Gym's ``simple_agent`` does: seed the session, call the model server and the tools until
the model answers without a tool call (at most four model calls), then verify.

``python nemo_gym_vault.py --agent-port 11002 --resources-port 11001 --model 127.0.0.1:11010``
serves both, with the policy's model server at ``--model`` (rollwire's, which NeMo Gym does not
start). They are served here with uvicorn in one process, from a config built in code: ``ng_run``
would also start Ray and build a venv per server from the network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import uvicorn
from fastapi import Body, Request, Response
from fastapi.responses import PlainTextResponse
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import (
    SESSION_ID_KEY,
    BaseServerConfig,
    GlobalAIOHTTPAsyncClientConfig,
    ServerClient,
    get_response_json,
    raise_for_status,
    set_global_aiohttp_client,
)
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, PrivateAttr

from rollwire.envs.vault.game import Vault

__all__ = ["VaultAgent", "VaultResourcesServer", "main", "serve"]

MAX_MODEL_CALLS = 4
#: the reward for calling ``read_code``, and again for reading the task's box; opening adds 1
READ_REWARD = 0.1


class VaultSeed(BaseSeedSessionRequest):
    box: str
    code: int


class ReadCode(BaseModel):
    box: str


class OpenBox(BaseModel):
    box: str
    code: str


class VaultVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")


class VaultVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")
    read_code: bool = False
    read_right_box: bool = False
    open_attempts: int = 0


class VaultResourcesServer(SimpleResourcesServer):
    """The box of each NeMo Gym session (the session id its cookie carries)."""

    config: BaseResourcesServerConfig
    _vaults: dict[str, Vault] = PrivateAttr(default_factory=dict)
    _reads: dict[str, set[str]] = PrivateAttr(default_factory=dict)

    def setup_webserver(self) -> Any:
        app = super().setup_webserver()
        app.post("/read_code")(self.read_code)
        app.post("/open_box")(self.open_box)
        return app

    def _vault(self, request: Request) -> Vault:
        return self._vaults[request.session[SESSION_ID_KEY]]

    async def seed_session(self, request: Request, body: VaultSeed) -> BaseSeedSessionResponse:
        self._vaults[request.session[SESSION_ID_KEY]] = Vault(body.box.upper(), body.code)
        return BaseSeedSessionResponse()

    async def read_code(self, request: Request, body: ReadCode) -> PlainTextResponse:
        vault = self._vault(request)
        boxes = self._reads.setdefault(request.session[SESSION_ID_KEY], set())
        boxes.add(body.box.strip().upper())
        return PlainTextResponse(vault.read_code(body.box))

    async def open_box(self, request: Request, body: OpenBox) -> PlainTextResponse:
        return PlainTextResponse(self._vault(request).open_box(body.box, body.code))

    async def verify(self, request: Request, body: VaultVerifyRequest) -> VaultVerifyResponse:
        session = request.session[SESSION_ID_KEY]
        vault = self._vaults.pop(session)
        boxes = self._reads.pop(session, set())
        read, right = bool(boxes), vault.box in boxes
        return VaultVerifyResponse(
            **body.model_dump(),
            reward=READ_REWARD * (read + right) + vault.reward(),
            read_code=read,
            read_right_box=right,
            open_attempts=len(vault.attempts),
        )


class VaultAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef


class VaultRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class VaultAgent(SimpleResponsesAPIAgent):
    """``/run``: seed, the model/tool loop, verify, passing each server's cookies on."""

    config: VaultAgentConfig

    async def _post(self, server: str, path: str, body: Any, cookies: Any) -> Any:
        return await self.server_client.post(
            server_name=server, url_path=path, json=body, cookies=cookies
        )

    async def responses(
        self,
        request: Request,
        response: Response,
        body: NeMoGymResponseCreateParamsNonStreaming = Body(),
    ) -> NeMoGymResponse:
        params = body.model_dump(exclude_unset=True)
        outputs: list[dict[str, Any]] = []
        cookies = request.cookies
        answer: NeMoGymResponse | None = None
        for _ in range(MAX_MODEL_CALLS):
            step = {**params, "input": list(params["input"]) + outputs}
            reply = await self._post(self.config.model_server.name, "/v1/responses", step, None)
            await raise_for_status(reply)
            answer = NeMoGymResponse.model_validate(await get_response_json(reply))
            calls = [o for o in answer.output if o.type == "function_call"]
            outputs += [o.model_dump(exclude_none=True) for o in answer.output]
            if not calls:
                break
            for call in calls:
                tool = await self._post(
                    self.config.resources_server.name,
                    f"/{call.name}",
                    json.loads(call.arguments or "{}"),
                    cookies,
                )
                cookies = tool.cookies
                text = (await tool.content.read()).decode()
                outputs.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": text}
                )
        for key, value in cookies.items():
            response.set_cookie(key, value.value if hasattr(value, "value") else value)
        assert answer is not None
        return NeMoGymResponse.model_validate({**answer.model_dump(), "output": outputs})

    async def run(self, request: Request, body: VaultRunRequest) -> VaultVerifyResponse:
        resources = self.config.resources_server.name
        seeded = await self._post(resources, "/seed_session", body.model_dump(), request.cookies)
        await raise_for_status(seeded)
        done = await self._post(
            self.config.name, "/v1/responses", body.responses_create_params, seeded.cookies
        )
        await raise_for_status(done)
        verify = {**body.model_dump(), "response": await get_response_json(done)}
        verified = await self._post(resources, "/verify", verify, done.cookies)
        await raise_for_status(verified)
        return VaultVerifyResponse.model_validate(await get_response_json(verified))


def _config(resources_port: int, agent_port: int, model: str) -> Any:
    """NeMo Gym's global config: the two servers, and the policy's model server with no
    ``entrypoint`` (rollwire's, which nothing here starts)."""
    host, _, port = model.rpartition(":")

    def server(port: int) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": port, "entrypoint": "nemo_gym_vault.py"}

    return OmegaConf.create(
        {
            "vault_resources": {"resources_servers": {"vault": server(resources_port)}},
            "vault_agent": {"responses_api_agents": {"vault_agent": server(agent_port)}},
            "policy_model": {
                "responses_api_models": {"rollwire": {"host": host, "port": int(port)}}
            },
        }
    )


async def serve(resources_port: int, agent_port: int, model: str) -> None:
    """Serve the resources and agent servers on this event loop (NeMo Gym's HTTP client is bound
    to it); prints ``ready`` once both accept connections."""
    config = _config(resources_port, agent_port, model)
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=0), global_config_dict=config
    )
    resources = VaultResourcesServer(
        config=BaseResourcesServerConfig(
            host="127.0.0.1",
            port=resources_port,
            entrypoint="nemo_gym_vault.py",
            name="vault_resources",
        ),
        server_client=client,
    )
    agent = VaultAgent(
        config=VaultAgentConfig(
            host="127.0.0.1", port=agent_port, entrypoint="nemo_gym_vault.py", name="vault_agent",
            resources_server=ResourcesServerRef(type="resources_servers", name="vault_resources"),
            model_server=ModelServerRef(type="responses_api_models", name="policy_model"),
        ),
        server_client=client,
    )  # fmt: skip
    servers = []
    for server, port in ((resources, resources_port), (agent, agent_port)):
        app = server.setup_webserver()
        server.setup_liveness(app)
        servers.append(
            uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        )
    running = [asyncio.create_task(s.serve()) for s in servers]
    while not all(s.started for s in servers):
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    await asyncio.gather(*running)


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resources-port", type=int, default=11001)
    parser.add_argument("--agent-port", type=int, default=11002)
    parser.add_argument("--model", default="127.0.0.1:11010", help="the policy's model server")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.resources_port, args.agent_port, args.model))


if __name__ == "__main__":
    main()
