"""The scripted mock LLM (testkit/mockllm.py) as a compose service, scripted over HTTP.

Besides the provider paths it answers, for the test driver on the host:

    POST /_mock/enqueue   [{"text": "hi"}, {"tool_use": [["tu_1", "sh", {...}]]}, {"hang": 3}]
    GET  /_mock/requests  every provider request received so far
    POST /_mock/reset     forget scripted replies and received requests
"""

from __future__ import annotations

import json

from testkit.mockllm import MockLLM, Reply, read_body, respond, serve_from_command_line

CONTROL_PREFIX = "/_mock/"


def to_reply(item: dict) -> Reply:
    if "tool_use" in item:
        return Reply.tool_use([tuple(call) for call in item["tool_use"]], text=item.get("text", ""))
    if "hang" in item:
        return Reply.hang(float(item["hang"]))
    return Reply.text(item["text"])


class ScriptedMockLLM(MockLLM):
    async def app(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(CONTROL_PREFIX):
            await super().app(scope, receive, send)
            return
        body = await read_body(receive)
        action = scope["path"][len(CONTROL_PREFIX):]
        if action == "enqueue" and scope["method"] == "POST":
            self.enqueue(*(to_reply(item) for item in json.loads(body)))
            await respond(send, 200, b'{"enqueued":true}')
        elif action == "requests" and scope["method"] == "GET":
            await respond(send, 200, json.dumps(self.requests).encode())
        elif action == "reset" and scope["method"] == "POST":
            self.reset()
            await respond(send, 200, b'{"reset":true}')
        else:
            await respond(send, 404, b'{"error":"not found"}')


if __name__ == "__main__":
    serve_from_command_line(ScriptedMockLLM, "scripted mock LLM", "0.0.0.0")
