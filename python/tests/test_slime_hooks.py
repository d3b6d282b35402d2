"""Slime's hooks (`generate`, `reward_func`) against the real fake SGLang `/generate`.

The prompt ids are checked against an oracle the bridge does not use: `policy-serving tokenize`
(the Rust chat-template crate, golden-tested against HF) for the repository's mini model, and the
output tokens against a direct `/generate` call. Without `transformers` the chat template comes
from a stand-in tokenizer, whose every call is recorded.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import subprocess
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import FAKE_BIN, REPO, SERVER_BIN, Proc, free_port, needs_binaries
import policy_serving_rollout.slime_hooks as hooks
from policy_serving_rollout import GenerateError, generate, reward_func

MINI = REPO / "config" / "mini-model"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Plan a weekend in Rome."},
]


@pytest.fixture(autouse=True)
def _fresh_tokenizers() -> Iterator[None]:
    hooks.reset_tokenizers()
    yield
    hooks.reset_tokenizers()


@pytest.fixture
def sample_cls(monkeypatch: pytest.MonkeyPatch) -> type:
    """Slime's Sample as far as generate touches it (the real one when Slime is installed)."""
    import dataclasses
    import enum

    @dataclasses.dataclass
    class Sample:
        class Status(enum.Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        prompt: Any = ""
        tokens: List[int] = dataclasses.field(default_factory=list)
        response: str = ""
        response_length: int = 0
        reward: Any = None
        loss_mask: Optional[List[int]] = None
        weight_versions: List[str] = dataclasses.field(default_factory=list)
        rollout_log_probs: Optional[List[float]] = None
        status: "Sample.Status" = Status.PENDING
        apply_chat_template_kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)

    return Sample


class StandInTokenizer:
    """A stand-in for an HF tokenizer: a ChatML-like template and byte ids, every call recorded.

    With ``add_special_tokens=True`` it puts a BOS id first, so a caller that forgets to turn it
    off gets other ids.
    """

    BOS = 500

    def __init__(self, path: str) -> None:
        self.path = path
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

    def apply_chat_template(self, messages: List[Dict[str, Any]], **kw: Any) -> str:
        self.calls.append(("apply_chat_template", kw))
        assert kw.get("tokenize") is False
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if kw.get("add_generation_prompt"):
            text += "<|im_start|>assistant\n"
            if kw.get("enable_thinking") is False:
                text += "<think>\n\n</think>\n\n"
        return text

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        self.calls.append(("encode", {"add_special_tokens": add_special_tokens}))
        return ([self.BOS] if add_special_tokens else []) + list(text.encode("utf-8"))


@pytest.fixture
def stand_in_transformers(monkeypatch: pytest.MonkeyPatch) -> List[StandInTokenizer]:
    made: List[StandInTokenizer] = []

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path: str, trust_remote_code: bool = False) -> StandInTokenizer:
            tok = StandInTokenizer(path)
            made.append(tok)
            return tok

    mod = types.ModuleType("transformers")
    mod.AutoTokenizer = AutoTokenizer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", mod)
    return made


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Iterator[str]:
    if not FAKE_BIN.is_file():
        pytest.skip(f"fake-sglang not built in {FAKE_BIN.parent}")
    port = free_port()
    p = Proc(
        [str(FAKE_BIN), "--port", str(port), "--model-dir", str(MINI)],
        f"http://127.0.0.1:{port}",
        tmp_path / "fake.log",
    )
    yield p.url
    p.stop()


def slime_args(url: str, **kw: Any) -> Any:
    host, port = url.rsplit("//", 1)[1].split(":")
    a = dict(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(MINI))
    a.update(kw)
    return types.SimpleNamespace(**a)


def post(url: str, body: Dict[str, Any]) -> Dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(
        url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def tokenize_cli(messages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """`policy-serving tokenize` for the mini model: the prompt text and ids, generation prompt included."""
    if not SERVER_BIN.is_file():
        pytest.skip(f"policy-serving not built in {SERVER_BIN.parent}")
    line = json.dumps({"messages": messages, "response_message": {"role": "assistant", "content": "ok"}})
    out = subprocess.run(
        [str(SERVER_BIN), "tokenize", "--model-dir", str(MINI)],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout.splitlines()[0])
    assert "error" not in doc, doc
    return doc


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- as Slime loads and calls them -----------------------------------------------------------------


def test_hooks_load_by_module_path_and_have_slimes_signatures() -> None:
    for path in ("policy_serving_rollout.generate", "policy_serving_rollout.reward_func"):
        module, _, attr = path.rpartition(".")  # slime.utils.misc.load_function
        fn = getattr(importlib.import_module(module), attr)
        assert inspect.iscoroutinefunction(fn), f"Slime awaits {path}"
    # Slime passes `evaluation=` only when the signature has it (sglang_rollout.generate_and_rm)
    assert "evaluation" in inspect.signature(generate).parameters
    assert list(inspect.signature(reward_func).parameters)[:2] == ["args", "sample_or_samples"]


# -- generate against the fake SGLang --------------------------------------------------------------


@needs_binaries
def test_generate_renders_the_chat_template_and_fills_the_sample(
    fake_sglang: str, sample_cls: type, stand_in_transformers: List[StandInTokenizer]
) -> None:
    sample = sample_cls(prompt=list(MESSAGES), apply_chat_template_kwargs={"enable_thinking": False})
    sp = {"max_new_tokens": 256, "temperature": 0.6}
    out = run(generate(slime_args(fake_sglang), sample, sp, evaluation=True))
    assert out is sample
    (tok,) = stand_in_transformers
    assert tok.path == str(MINI), "the tokenizer of args.hf_checkpoint"
    expected_text = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nPlan a weekend in Rome."
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    prompt_ids = list(expected_text.encode())
    assert sample.tokens[: len(prompt_ids)] == prompt_ids, "rendered with the generation prompt, no BOS"
    assert tok.calls[0][1]["enable_thinking"] is False, "the sample's apply_chat_template_kwargs"
    direct = post(fake_sglang, {"input_ids": prompt_ids, "sampling_params": sp, "return_logprob": True})
    t = len(direct["output_ids"])
    assert t > 0 and sample.response_length == t
    assert sample.tokens == prompt_ids + direct["output_ids"]
    assert sample.response == direct["text"] and sample.response
    assert sample.rollout_log_probs == [row[0] for row in direct["meta_info"]["output_token_logprobs"]]
    assert len(sample.rollout_log_probs) == t and all(lp <= 0 for lp in sample.rollout_log_probs)
    assert sample.loss_mask == [1] * t
    assert sample.status is sample_cls.Status.COMPLETED
    assert sample.weight_versions == ["default"], "meta_info.weight_version is recorded"
    assert sample.prompt == MESSAGES, "the prompt itself is left as it was"


@needs_binaries
def test_generate_marks_a_length_stop_truncated(
    fake_sglang: str, sample_cls: type, stand_in_transformers: List[StandInTokenizer]
) -> None:
    sample = sample_cls(prompt=list(MESSAGES))
    run(generate(slime_args(fake_sglang), sample, {"max_new_tokens": 3}))
    assert sample.status is sample_cls.Status.TRUNCATED
    assert sample.response_length == 3 and len(sample.rollout_log_probs) == 3
    assert sample.loss_mask == [1, 1, 1]


@needs_binaries
def test_generate_takes_a_rendered_string_and_the_ids_sglang_used(
    fake_sglang: str, sample_cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # no local tokenizer
    oracle = tokenize_cli(MESSAGES)
    sample = sample_cls(prompt=oracle["prompt_text"])
    run(generate(slime_args(fake_sglang), sample, {"max_new_tokens": 64}))
    n = len(oracle["prompt_ids"])
    assert sample.tokens[:n] == oracle["prompt_ids"], "the prompt ids SGLang tokenized"
    assert len(sample.tokens) == n + sample.response_length and sample.response_length > 0
    assert sample.prompt == oracle["prompt_text"]


@needs_binaries
def test_generate_with_real_transformers_matches_the_policy_tokenizer(
    fake_sglang: str, sample_cls: type
) -> None:
    if os.environ.get("POLICY_SERVING_REQUIRE_TRANSFORMERS") == "1":
        import jinja2  # noqa: F401  (CI installs both: this test must not skip there)
        import transformers  # noqa: F401
    pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    oracle = tokenize_cli(MESSAGES)
    sample = sample_cls(prompt=list(MESSAGES))
    run(generate(slime_args(fake_sglang), sample, {"max_new_tokens": 64}))
    n = len(oracle["prompt_ids"])
    assert sample.tokens[:n] == oracle["prompt_ids"]
    assert sample.response_length > 0 and len(sample.tokens) == n + sample.response_length
    # a rendered string is tokenized locally to the same ids
    rendered = sample_cls(prompt=oracle["prompt_text"])
    run(generate(slime_args(fake_sglang), rendered, {"max_new_tokens": 64}))
    assert rendered.tokens[:n] == oracle["prompt_ids"]


# -- errors -----------------------------------------------------------------------------------------


def test_chat_prompt_without_transformers_says_what_to_install(
    sample_cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(GenerateError) as e:
        run(generate(slime_args("http://127.0.0.1:1"), sample_cls(prompt=list(MESSAGES)), {}))
    msg = str(e.value)
    assert "transformers" in msg and "pip install" in msg and "chat template" in msg


def test_chat_prompt_without_hf_checkpoint_names_the_flag(
    sample_cls: type, stand_in_transformers: List[StandInTokenizer]
) -> None:
    a = slime_args("http://127.0.0.1:1", hf_checkpoint=None)
    with pytest.raises(GenerateError, match="--hf-checkpoint"):
        run(generate(a, sample_cls(prompt=list(MESSAGES)), {}))


def test_missing_router_address_names_the_flags(sample_cls: type) -> None:
    a = types.SimpleNamespace(sglang_router_ip=None, sglang_router_port=None, hf_checkpoint=None)
    with pytest.raises(GenerateError, match="--sglang-router-ip"):
        run(generate(a, sample_cls(prompt="rendered"), {}))


class Stub:
    """A one-answer HTTP server standing in for SGLang where the fake cannot say it."""

    def __init__(self, status: int, body: Any) -> None:
        self.requests: List[Dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                n = int(self.headers.get("Content-Length") or 0)
                stub.requests.append(json.loads(self.rfile.read(n)))
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[Any]:
    made: List[Stub] = []

    def make(status: int, body: Any) -> Stub:
        s = Stub(status, body)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_aborted_answer_is_an_aborted_sample_without_weight_version(
    stub: Any, sample_cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    s = stub(
        200,
        {
            "text": "He",
            "output_ids": [7],
            "meta_info": {
                "finish_reason": {"type": "abort", "message": "aborted by the router"},
                "input_token_logprobs": [[None, 1, None], [-0.5, 2, None]],
                "output_token_logprobs": [[-0.25, 7, None]],
            },
        },
    )
    sample = sample_cls(prompt="rendered prompt")
    run(generate(slime_args(s.url), sample, {"max_new_tokens": 8}))
    assert sample.status is sample_cls.Status.ABORTED
    assert sample.weight_versions == []
    assert sample.tokens == [1, 2, 7] and sample.rollout_log_probs == [-0.25]
    (req,) = s.requests
    assert req["text"] == "rendered prompt" and req["return_logprob"] is True
    assert req["logprob_start_len"] == 0 and req["sampling_params"] == {"max_new_tokens": 8}


def test_answer_without_logprobs_is_an_error_not_zeros(
    stub: Any, sample_cls: type, stand_in_transformers: List[StandInTokenizer]
) -> None:
    s = stub(200, {"text": "hi", "output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop"}}})
    sample = sample_cls(prompt=list(MESSAGES))
    with pytest.raises(GenerateError, match="meta_info.output_token_logprobs"):
        run(generate(slime_args(s.url), sample, {}))
    assert sample.tokens == [] and sample.status is sample_cls.Status.PENDING, "the sample is untouched"


def test_http_error_and_unreachable_sglang_name_the_url(
    stub: Any, sample_cls: type, stand_in_transformers: List[StandInTokenizer]
) -> None:
    s = stub(400, {"error": {"message": "The input is empty."}})
    with pytest.raises(GenerateError) as e:
        run(generate(slime_args(s.url), sample_cls(prompt=list(MESSAGES)), {}))
    assert f"{s.url}/generate" in str(e.value) and "400" in str(e.value) and "input is empty" in str(e.value)
    with pytest.raises(GenerateError) as e2:
        run(generate(slime_args("http://127.0.0.1:1"), sample_cls(prompt=list(MESSAGES)), {}))
    assert "http://127.0.0.1:1/generate" in str(e2.value) and "--sglang-router-port" in str(e2.value)
