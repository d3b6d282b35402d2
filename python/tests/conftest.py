"""Fixtures that run the real `policy-serving` and `fake-sglang` binaries."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import sys

import pytest

# Run from a checkout without `pip install -e python` too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policy_serving_rollout import RolloutClient, reset_bridges  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(
    os.environ.get("POLICY_SERVING_BIN_DIR")
    or Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug"
)
SERVER_BIN = BIN_DIR / "policy-serving"
FAKE_BIN = BIN_DIR / "fake-sglang"

needs_binaries = pytest.mark.skipif(
    not (SERVER_BIN.is_file() and FAKE_BIN.is_file()),
    reason=f"policy-serving / fake-sglang binaries not found in {BIN_DIR} "
    "(build them with `cargo build -p policy-serving -p fake-sglang` or set POLICY_SERVING_BIN_DIR)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_health(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url}/health not ready after {timeout}s:\n{log.read_text()}")


class Proc:
    def __init__(
        self, args: List[str], url: str, log: Path, env: Optional[Dict[str, str]] = None
    ) -> None:
        self.url = url
        self.log = log
        self._fh = open(log, "wb")
        self.proc = subprocess.Popen(
            args, stdout=self._fh, stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_health(url, self.proc, log)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()


class Stack:
    """A fake SGLang plus a policy-serving server using it, and helpers to drive them."""

    def __init__(
        self,
        tmp: Path,
        mode: str = "rl",
        admin_key: Optional[str] = None,
        store: str = "embedded",
        model_dir: Optional[Path] = None,
        fake_args: Optional[List[str]] = None,
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        fport = free_port()
        self.model_dir = model_dir
        model = ["--model-dir", str(model_dir)] if model_dir else []
        self.fake = Proc(
            [str(FAKE_BIN), "--port", str(fport), *model, *(fake_args or [])],
            f"http://127.0.0.1:{fport}",
            tmp / "fake.log",
        )
        self.tmp = tmp
        self.mode = mode
        self.admin_key = admin_key
        self.store = tmp / "store"
        self.store_kind = store
        # One stream per stack on the shared Redis (see REDIS_URL).
        self.deployment = f"py-{os.getpid()}-{next(_DEPLOYMENTS)}-{time.time_ns()}"
        self.server: Optional[Proc] = None
        try:
            self.start_server()
        except Exception:
            self.fake.stop()
            raise

    def start_server(self) -> None:
        port = free_port()
        fake = self.fake.url
        lines = [
            "[server]",
            'host = "127.0.0.1"',
            f"port = {port}",
            f'mode = "{self.mode}"',
            'default_turn_type = "main"',
            *([f'model_dir = "{self.model_dir}"'] if self.model_dir else []),
            *(['admin_key_env = "PS_TEST_ADMIN_KEY"'] if self.admin_key else []),
            "[sglang]",
            f'chat_url = "{fake}/v1/chat/completions"',
            "[prm]",
            f'router_url = "{fake}/generate"',
            "timeout_sec = 5",
            "[logging]",
            f'prm_record_dir = "{self.tmp}/records/prm"',
            f'opd_record_dir = "{self.tmp}/records/opd"',
            "[store]",
            f'path = "{self.store}"',
        ]
        if self.store_kind == "redis":
            lines += [
                'kind = "redis"',
                "[store.redis]",
                f'url = "{REDIS_URL}"',
                f'deployment = "{self.deployment}"',
                # Fixed, so that a restarted server (on another port) resumes its pending turns.
                'replica = "py-test"',
            ]
        if self.mode != "rl":
            lines += ["[teacher]", f'url = "{fake}/generate"', "timeout_sec = 5"]
        cfg = self.tmp / "settings.toml"
        cfg.write_text("\n".join(lines) + "\n")
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("POLICY_SERVING_") or k in ("OPENCLAW_PORT", "PORT", "HOST"):
                env.pop(k)
        if self.admin_key:
            env["PS_TEST_ADMIN_KEY"] = self.admin_key
        self.server = Proc(
            [str(SERVER_BIN), "serve", "--config", str(cfg)],
            f"http://127.0.0.1:{port}",
            self.tmp / f"server-{port}.log",
            env=env,
        )

    def restart_server(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.start_server()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def client(self) -> RolloutClient:
        return RolloutClient(self.url, admin_key=self.admin_key)

    def chat(self, session: str, messages: List[Dict[str, Any]], done: bool) -> Dict[str, Any]:
        """One chat request in `session` (closed with it when `done`); the answer."""
        headers = {"Content-Type": "application/json", "X-Session-Id": session}
        if done:
            headers["X-Session-Done"] = "1"
        body = json.dumps({"model": "default", "messages": messages}).encode()
        req = urllib.request.Request(
            self.url + "/v1/chat/completions", data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def two_turns(self, session: str, next_state: str) -> None:
        first = [{"role": "user", "content": "Plan a weekend in Rome."}]
        a = self.chat(session, first, done=False)
        msg = a["choices"][0]["message"]
        history = first + [
            {"role": "assistant", "content": msg.get("content") or ""},
            {"role": "user", "content": next_state},
        ]
        self.chat(session, history, done=True)

    def wait_for(self, pred: Callable[[Dict[str, Any]], bool], timeout: float = 20.0) -> Dict[str, Any]:
        c = self.client()
        deadline = time.monotonic() + timeout
        st: Dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = c.status()
            if pred(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"condition not met; last status: {st}")

    def settled(self, min_last_seq: int) -> Dict[str, Any]:
        """Wait until at least `min_last_seq` samples are stored and nothing is pending."""
        return self.wait_for(
            lambda st: int(st["last_seq"]) >= min_last_seq
            and int(st["live_sessions"]) == 0
            and all(int(v) == 0 for v in st["pending"].values())
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.fake.stop()


@pytest.fixture(autouse=True)
def _fresh_bridges() -> Iterator[None]:
    reset_bridges()
    yield
    reset_bridges()


# The Redis server .ci/run starts on loopback; without it the Redis variants skip.
REDIS_URL = os.environ.get("POLICY_SERVING_REDIS_URL", "").strip()
_DEPLOYMENTS = itertools.count()


@pytest.fixture(params=["embedded", "redis"])
def rl_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The RL stack over each store: the trainer side must not see which one is used."""
    if request.param == "redis" and not REDIS_URL:
        if os.environ.get("POLICY_SERVING_REQUIRE_REDIS") == "1":
            raise AssertionError("POLICY_SERVING_REQUIRE_REDIS=1 but POLICY_SERVING_REDIS_URL is unset")
        pytest.skip("POLICY_SERVING_REDIS_URL is not set (no Redis to test against)")
    s = Stack(tmp_path / "rl", "rl", store=request.param)
    yield s
    s.stop()


@pytest.fixture
def vl_stack(tmp_path: Path) -> Iterator[Stack]:
    """The RL stack serving the mini vision-language model (config/mini-vl-model)."""
    s = Stack(tmp_path / "vl", "rl", model_dir=REPO / "config" / "mini-vl-model")
    yield s
    s.stop()


@pytest.fixture
def moe_stack(tmp_path: Path) -> Iterator[Stack]:
    """The RL stack serving the mini model as a mixture of experts (4 layers, top-2 of 16) whose
    engine returns routed experts: its `config.json` beside the tokenizer gives the shape."""
    model = tmp_path / "moe-model"
    model.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REPO / "config" / "mini-model" / f, model / f)
    (model / "config.json").write_text(
        json.dumps({"num_hidden_layers": 4, "num_experts_per_tok": 2, "num_experts": 16})
    )
    s = Stack(tmp_path / "moe", "rl", model_dir=model, fake_args=["--routed-experts", "4:2:16"])
    yield s
    s.stop()


@pytest.fixture
def opd_stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path / "opd", "opd")
    yield s
    s.stop()


def pytest_configure(config):  # noqa: D103 - pytest hook
    # In CI the binaries are built first: a missing one is a failure, never a silent skip.
    if os.environ.get("CI") and not (SERVER_BIN.exists() and FAKE_BIN.exists()):
        raise pytest.UsageError(f"CI: policy-serving / fake-sglang binaries missing in {BIN_DIR}")
