"""Round trips against the real policy-serving binary and fake SGLang."""

from __future__ import annotations

import math
import os
import sys
import threading
import types
from typing import Any, Callable, Dict, List

import pytest

from conftest import Stack, needs_binaries
from policy_serving_rollout import (
    RolloutAPIError,
    RolloutClient,
    RolloutConnectionError,
    generate_rollout,
    get_bridge,
    reset_bridges,
)

pytestmark = needs_binaries


@pytest.fixture(autouse=True)
def _no_slime(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the plain-dict form; hide a real Slime if one is installed."""
    monkeypatch.setitem(sys.modules, "slime", None)


def args_for(stack: Stack, batch: int) -> Any:
    return types.SimpleNamespace(
        rollout_batch_size=batch,
        policy_serving_url=stack.url,
        policy_serving_wait_ms=500,
        policy_serving_timeout_sec=20,
    )


def seqs(out: Any) -> List[int]:
    return [g[0]["index"] for g in out.samples]


def during_rollout(stack: Stack, traffic: Callable[[], None]) -> threading.Thread:
    """Runs `traffic` once the rollout has resumed submission (the server starts paused here)."""
    stack.client().pause()
    errors: List[BaseException] = []

    def go() -> None:
        try:
            stack.wait_for(lambda st: st["submission_enabled"] is True)
            traffic()
        except BaseException as e:  # surfaced by join_ok
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def join_ok(t: threading.Thread) -> None:
    t.join(timeout=60)
    assert not t.is_alive(), "the traffic thread did not finish"
    assert not t.errors, t.errors  # type: ignore[attr-defined]


def test_rl_round_trip(rl_stack: Stack) -> None:
    t = during_rollout(rl_stack, lambda: rl_stack.two_turns("s1", "Great, that worked. FAKE_VOTES=1"))
    out = generate_rollout(args_for(rl_stack, 2), 0, None)
    join_ok(t)
    assert [len(g) for g in out.samples] == [1, 1]
    first, second = out.samples[0][0], out.samples[1][0]
    assert isinstance(first, dict), "plain dicts without slime"
    assert first["index"] == first["group_index"] == 1 and second["index"] == 2
    assert first["session_id"] == "s1" and first["turn"] == 1
    assert first["reward"] == {"score": 1.0}
    assert first["status"] == "completed"
    t = first["response_length"]
    assert t > 0 and len(first["loss_mask"]) == t and len(first["rollout_log_probs"]) == t
    assert any(first["loss_mask"])
    assert len(first["tokens"]) > t
    # every submitted RL sample's score: turn 1 scored 1, turn 2 (no next state) 0
    assert out.metrics == {"rollout/prm_eval_score": 0.5}
    st = rl_stack.client().status()
    assert st["committed_seq"] == 2
    assert st["submission_enabled"] is False, "the rollout pauses submission at the end"
    # the next call resumes submission again
    rl_stack.client().resume()
    rl_stack.two_turns("s2", "Thanks. FAKE_VOTES=1")
    rl_stack.settled(4)
    out2 = generate_rollout(args_for(rl_stack, 2), 1, None)
    assert seqs(out2) == [3, 4]


def test_eval_scores_from_before_the_resume_are_not_counted(rl_stack: Stack) -> None:
    # A conversation judged -1 while no rollout is collecting (as turns judged after a pause).
    rl_stack.two_turns("before", "No, that is wrong, do it again. FAKE_VOTES=-1")
    before = rl_stack.settled(2)
    assert before["eval_scores"]["count"] >= 1 and before["eval_scores"]["mean"] < 0
    client = rl_stack.client()
    drained: List[Dict[str, Any]] = []
    calls: List[str] = []
    real_drain, real_resume = client.drain_eval_scores, client.resume

    def drain() -> Dict[str, Any]:
        calls.append("drain")
        drained.append(real_drain())
        return drained[-1]

    def resume(weight_version: Any = None) -> Dict[str, Any]:
        calls.append("resume")
        return real_resume(weight_version)

    bridge = get_bridge(rl_stack.url, None, wait_ms=500)
    bridge.client = client
    client.drain_eval_scores, client.resume = drain, resume  # type: ignore[method-assign]
    t = during_rollout(rl_stack, lambda: rl_stack.two_turns("during", "Thanks, perfect. FAKE_VOTES=1"))
    out = generate_rollout(args_for(rl_stack, 4), 0, None)
    join_ok(t)
    assert seqs(out) == [1, 2, 3, 4]
    assert calls == ["drain", "resume", "drain"], "reset, resume, ..., drain"
    reset, final = drained
    assert -1.0 in reset["scores"], "the reset took the scores judged before the resume"
    assert final["count"] >= 1 and -1.0 not in final["scores"]
    assert out.metrics == {"rollout/prm_eval_score": final["mean"]}
    assert out.metrics["rollout/prm_eval_score"] > 0


def test_no_eval_scores_means_no_metric(rl_stack: Stack) -> None:
    rl_stack.two_turns("s1", "FAKE_VOTES=1")
    rl_stack.settled(2)
    rl_stack.client().drain_eval_scores()
    out = generate_rollout(args_for(rl_stack, 1), 0, None)
    assert out.metrics is None


def test_json_and_msgpack_pages_agree(rl_stack: Stack) -> None:
    if os.environ.get("POLICY_SERVING_REQUIRE_MSGPACK") == "1":
        import msgpack  # noqa: F401  (CI installs it: this test must not skip there)
    pytest.importorskip("msgpack")
    rl_stack.two_turns("s1", "FAKE_VOTES=1")
    rl_stack.settled(2)
    a, last_a = RolloutClient(rl_stack.url, use_msgpack=False).pull(0)
    b, last_b = RolloutClient(rl_stack.url, use_msgpack=True).pull(0)
    assert last_a == last_b == 2
    assert a == b


def test_opd_round_trip(opd_stack: Stack) -> None:
    opd_stack.two_turns("o1", "I wanted museums, not food. FAKE_VOTES=1,1,1")
    opd_stack.settled(1)
    out = generate_rollout(args_for(opd_stack, 1), 0, None)
    (sample,) = [g[0] for g in out.samples]
    t = sample["response_length"]
    assert len(sample["teacher_log_probs"]) == t
    assert all(isinstance(x, float) and math.isfinite(x) and x <= 0 for x in sample["teacher_log_probs"])
    assert sample["metadata"]["mode"] == "opd"
    assert sample["reward"] == {"score": 1.0}
    assert opd_stack.client().status()["committed_seq"] == 1


def test_restart_resumes_from_committed_point(rl_stack: Stack) -> None:
    for i in range(3):
        rl_stack.two_turns(f"s{i}", "FAKE_VOTES=1")
    rl_stack.settled(6)
    out = generate_rollout(args_for(rl_stack, 2), 0, None)
    assert seqs(out) == [1, 2]
    # Seqs 3..6 were pulled into the carry-over but never committed. The trainer "crashes":
    # its carry-over is gone, and the server restarts too (durable store).
    reset_bridges()
    rl_stack.restart_server()
    st = rl_stack.client().status()
    assert st["committed_seq"] == 2 and st["last_seq"] == 6
    out = generate_rollout(args_for(rl_stack, 4), 1, None)
    assert seqs(out) == [3, 4, 5, 6]
    # and with a plain client: nothing left after the committed point
    samples, last = RolloutClient(rl_stack.url).pull(rl_stack.client().status()["committed_seq"])
    assert samples == [] and last == 6


def test_carry_over_loses_nothing_and_duplicates_nothing(rl_stack: Stack) -> None:
    for i in range(3):
        rl_stack.two_turns(f"s{i}", "FAKE_VOTES=1")
    rl_stack.settled(6)
    first = generate_rollout(args_for(rl_stack, 4), 0, None)
    assert seqs(first) == [1, 2, 3, 4]
    assert rl_stack.client().status()["committed_seq"] == 4, "carried-over samples stay uncommitted"
    # new samples arrive while the carry-over holds 5 and 6
    rl_stack.client().resume()
    rl_stack.two_turns("s9", "FAKE_VOTES=1")
    rl_stack.settled(8)
    second = generate_rollout(args_for(rl_stack, 4), 1, None)
    assert seqs(second) == [5, 6, 7, 8]
    assert sorted(seqs(first) + seqs(second)) == list(range(1, 9))
    assert rl_stack.client().status()["committed_seq"] == 8


def test_timeout_keeps_consumed_samples(rl_stack: Stack) -> None:
    rl_stack.two_turns("s1", "FAKE_VOTES=1")
    rl_stack.settled(2)
    a = args_for(rl_stack, 3)
    a.policy_serving_timeout_sec = 1
    with pytest.raises(TimeoutError):
        generate_rollout(a, 0, None)
    assert rl_stack.client().status()["committed_seq"] == 0
    a.policy_serving_timeout_sec = 20
    rl_stack.client().resume()
    rl_stack.two_turns("s2", "FAKE_VOTES=1")
    out = generate_rollout(a, 1, None)
    assert seqs(out) == [1, 2, 3]


def test_errors_name_url_status_and_code(rl_stack: Stack) -> None:
    c = rl_stack.client()
    with pytest.raises(RolloutAPIError) as e:
        c.commit(99)
    assert e.value.status == 409 and e.value.code == "commit_ahead"
    assert rl_stack.url + "/v1/rollout/commit" in str(e.value) and "409" in str(e.value)
    dead = RolloutClient("http://127.0.0.1:1", timeout=2)
    with pytest.raises(RolloutConnectionError) as e2:
        dead.status()
    assert "http://127.0.0.1:1/v1/rollout/status" in str(e2.value)


def test_admin_key_from_env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = Stack(tmp_path / "admin", "rl", admin_key="admin-secret")
    try:
        with pytest.raises(RolloutAPIError) as e:
            RolloutClient(stack.url).status()
        assert e.value.status == 401
        stack.two_turns("s1", "FAKE_VOTES=1")
        stack.settled(2)
        monkeypatch.setenv("POLICY_SERVING_ADMIN_KEY", "admin-secret")
        monkeypatch.setenv("POLICY_SERVING_URL", stack.url)
        a = types.SimpleNamespace(rollout_batch_size=2, policy_serving_timeout_sec=20)
        out = generate_rollout(a, 0, None)
        assert seqs(out) == [1, 2]
    finally:
        stack.stop()


def test_the_rollout_announces_its_policy_version_at_resume(rl_stack: Stack) -> None:
    # Streamed answers carry no weight_version: the server stamps the trainer's announced one.
    t = during_rollout(rl_stack, lambda: rl_stack.two_turns("v", "Thanks. FAKE_VOTES=1"))
    out = generate_rollout(args_for(rl_stack, 2), 7, None)
    join_ok(t)
    assert rl_stack.client().status()["trainer_weight_version"] == "7"
    assert len(out.samples) == 2


IMAGES = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "app", "tests", "fixtures", "images")


def _data_url(name: str, mime: str) -> str:
    import base64

    with open(os.path.join(IMAGES, name), "rb") as f:
        return f"data:{mime};base64," + base64.b64encode(f.read()).decode()


def _file(name: str) -> bytes:
    with open(os.path.join(IMAGES, name), "rb") as f:
        return f.read()


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_image_turns_reach_the_trainer_with_their_images_byte_identical(
    vl_stack: Stack, use_msgpack: bool
) -> None:
    if os.environ.get("POLICY_SERVING_REQUIRE_MSGPACK") == "1":
        import msgpack  # noqa: F401  (CI installs both: this test must not skip there)
        import PIL.Image  # noqa: F401
    if use_msgpack:
        pytest.importorskip("msgpack")
    pil = pytest.importorskip("PIL.Image")
    first = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": _data_url("red-64x48.png", "image/png")}},
            ],
        }
    ]
    a = vl_stack.chat("img", first, done=False)
    history = first + [
        {"role": "assistant", "content": a["choices"][0]["message"].get("content") or ""},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _data_url("blue-300x200.jpg", "image/jpeg")}},
                {"type": "text", "text": "And this one?"},
            ],
        },
    ]
    vl_stack.chat("img", history, done=True)
    vl_stack.settled(2)
    client = RolloutClient(vl_stack.url, use_msgpack=use_msgpack)
    page, _ = client.pull(0, max=10)
    assert len(page) == 2
    from policy_serving_rollout import sample_to_slime

    second = sample_to_slime(page[1]["sample"])
    images = second["multimodal_inputs"]["images"]
    assert [im.size for im in images] == [(64, 48), (300, 200)], "in prompt order"
    assert [e["bytes"] for e in second["images"]] == [_file("red-64x48.png"), _file("blue-300x200.jpg")]
    assert second["multimodal_train_inputs"] is None, "left to Slime's processor"
    assert isinstance(images[0], pil.Image)
    # As many image pad tokens (989 in the mini-vl model) as the images stand for.
    assert second["tokens"].count(989) == sum(e["tokens"] for e in second["images"])
    first_sample = sample_to_slime(page[0]["sample"])
    assert len(first_sample["multimodal_inputs"]["images"]) == 1


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_routed_experts_reach_slime_as_the_engine_returned_them(
    moe_stack: Stack, use_msgpack: bool
) -> None:
    if os.environ.get("POLICY_SERVING_REQUIRE_MSGPACK") == "1":
        import msgpack  # noqa: F401  (CI installs both: this test must not skip there)
        import numpy  # noqa: F401
    if use_msgpack:
        pytest.importorskip("msgpack")
    np = pytest.importorskip("numpy")
    import base64
    import json
    import urllib.request

    # A prompt of more than 256 tokens: its experts span several blocks, joined in order.
    question = "Plan a weekend in Rome. " + "Museums, churches, food and walks. " * 60
    first_turn = [{"role": "user", "content": question}]
    a = moe_stack.chat("moe", first_turn, done=False)
    moe_stack.chat(
        "moe",
        first_turn
        + [
            {"role": "assistant", "content": a["choices"][0]["message"].get("content") or ""},
            {"role": "user", "content": "I wanted museums, not food. FAKE_VOTES=1,1,1"},
        ],
        done=True,
    )
    moe_stack.settled(2)
    client = RolloutClient(moe_stack.url, use_msgpack=use_msgpack)
    page, _ = client.pull(0, max=10)
    assert len(page) == 2
    from policy_serving_rollout import sample_to_slime

    assert len(page[0]["sample"]["rollout_routed_experts"]["blocks"]) >= 2
    first = sample_to_slime(page[0]["sample"])
    experts = first["rollout_routed_experts"]
    assert isinstance(experts, np.ndarray) and experts.dtype == np.int32
    assert experts.shape == (len(first["tokens"]) - 1, 4, 2)
    # The engine's own answer to the same request (the fake is deterministic): its routed
    # experts, as SGLang sends them (base64 int32), are the array Slime gets.
    body = json.dumps(
        {
            "model": "default",
            "messages": first_turn,
            "logprobs": True,
            "top_logprobs": 1,
            "return_token_ids": True,
            "return_routed_experts": True,
        }
    ).encode()
    req = urllib.request.Request(
        moe_stack.fake.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        answer = json.loads(r.read())
    raw = np.frombuffer(base64.b64decode(answer["sglext"]["routed_experts"]), dtype="<i4")
    choice = answer["choices"][0]
    assert list(first["tokens"]) == choice["prompt_token_ids"] + choice["response_token_ids"]
    assert np.array_equal(experts.reshape(-1), raw)
