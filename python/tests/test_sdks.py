"""The official SDKs as clients of the doors, against the real binaries: `anthropic`'s
`messages.create` / `messages.stream` through `POST /v1/messages`, `openai`'s `responses.create` /
`responses.stream` (and `previous_response_id`) through `POST /v1/responses`. Every answer must parse
in the SDK, tool calls must round-trip, and the turns must become samples through their door.

In CI (`POLICY_SERVING_REQUIRE_SDKS=1`) a missing SDK is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from conftest import Stack, needs_binaries


def _sdk(name: str) -> Any:
    if os.environ.get("POLICY_SERVING_REQUIRE_SDKS") == "1":
        return __import__(name)
    return pytest.importorskip(name)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path / "sdk", "rl")
    yield s
    s.stop()


TOOL_SCHEMA = {
    "type": "object",
    "properties": {"folder": {"type": "string"}},
    "required": ["folder"],
}


def _samples(stack: Stack, n: int) -> List[Dict[str, Any]]:
    """The first `n` samples, waiting (bounded: judging is local) until they are there."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(stack.url + "/v1/rollout/samples?after=0&max=100", timeout=30) as r:
            got = [s["sample"] for s in json.loads(r.read())["samples"]]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@needs_binaries
def test_anthropic_sdk_messages_create_and_stream_with_tools_and_thinking(stack: Stack) -> None:
    anthropic = _sdk("anthropic")
    client = anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0)
    tools = [{"name": "list_files", "description": "List a folder", "input_schema": TOOL_SCHEMA}]
    messages: List[Dict[str, Any]] = [
        {"role": "user", "content": "sdk-a what is in the docs folder? [call_tool]"}
    ]
    first = client.messages.create(
        model="default", max_tokens=300, system="Be brief.", messages=messages, tools=tools,
        extra_headers={"X-Session-Id": "sdk-anthropic", "X-Turn-Type": "main"},
    )
    assert first.type == "message" and first.role == "assistant"
    assert first.stop_reason == "tool_use"
    kinds = [b.type for b in first.content]
    assert kinds == ["thinking", "tool_use"], kinds
    call = first.content[1]
    assert call.name == "list_files" and isinstance(call.input, dict) and call.input["folder"]
    assert first.content[0].thinking and first.content[0].signature
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    # The tool result goes back; the answer is streamed this time, and builds the same shapes.
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "README.md"}]},
    ]
    with client.messages.stream(
        model="default", max_tokens=300, system="Be brief.", messages=messages, tools=tools,
        extra_headers={"X-Session-Id": "sdk-anthropic", "X-Turn-Type": "main"},
    ) as s:
        texts = list(s.text_stream)
        second = s.get_final_message()
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert "".join(texts) == second.content[1].text and "README.md" in second.content[1].text
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in second.content]},
        {"role": "user", "content": "thanks"},
    ]
    third = client.messages.create(
        model="default", max_tokens=100, messages=messages, system="Be brief.", tools=tools,
        extra_headers={"X-Session-Id": "sdk-anthropic", "X-Turn-Type": "main", "X-Session-Done": "1"},
    )
    assert third.stop_reason == "end_turn"
    # count_tokens parses in the SDK too.
    counted = client.messages.count_tokens(model="default", messages=messages, system="Be brief.", tools=tools)
    assert counted.input_tokens > 0
    # An error parses as the SDK's error type.
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="default", max_tokens=10, messages=[{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    assert "document" in str(e.value)
    samples = [s for s in _samples(stack, 3) if s["session_id"] == "sdk-anthropic"]
    assert len(samples) == 3 and all(s["metadata"]["door"] == "messages" for s in samples)


@needs_binaries
def test_openai_sdk_responses_create_stream_and_previous_response_id(stack: Stack) -> None:
    openai = _sdk("openai")
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "name": "list_files", "description": "List a folder", "parameters": TOOL_SCHEMA}]
    headers = {"X-Session-Id": "sdk-openai", "X-Turn-Type": "main"}
    first = client.responses.create(
        model="default", instructions="Be brief.", input="sdk-o what is in the docs folder? [call_tool]",
        tools=tools, extra_headers=headers,
    )
    assert first.status == "completed"
    kinds = [i.type for i in first.output]
    assert kinds == ["reasoning", "function_call"], kinds
    call = first.output[1]
    assert call.name == "list_files" and json.loads(call.arguments)["folder"]
    # The output goes back through previous_response_id (stored: the API's default), streamed.
    with client.responses.stream(
        model="default", instructions="Be brief.", previous_response_id=first.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "README.md"}],
        extra_headers=headers,
    ) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        second = s.get_final_response()
    assert second.status == "completed"
    assert second.output_text == "".join(deltas) and "README.md" in second.output_text
    third = client.responses.create(
        model="default", instructions="Be brief.", previous_response_id=second.id, input="thanks",
        tools=tools, extra_headers={**headers, "X-Session-Done": "1"},
    )
    assert third.output_text
    # An unknown previous response parses as the SDK's not-found error.
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="default", input="x", previous_response_id="resp_unknown")
    samples = [s for s in _samples(stack, 3) if s["session_id"] == "sdk-openai"]
    assert len(samples) == 3 and all(s["metadata"]["door"] == "responses" for s in samples)
    # The continued turns' prompts hold the whole conversation (the stored response's first).
    assert "sdk-o what is in the docs folder" in samples[2]["prompt"]
