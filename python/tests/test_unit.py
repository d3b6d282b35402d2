"""Unit tests with a fake client: aborted groups, carry-over on failure, Slime conversion."""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import policy_serving_rollout.slime_rollout as sr
from policy_serving_rollout import RolloutBridge, generate_rollout, sample_to_slime, to_slime_groups


def api_sample(seq: int, status: str = "completed", **extra: Any) -> Dict[str, Any]:
    s = {
        "index": seq,
        "group_index": seq,
        "prompt": "p",
        "response": "r",
        "tokens": [1, 2, 3],
        "response_length": 2,
        "loss_mask": [1, 1],
        "rollout_log_probs": [-0.5, -0.25],
        "reward": {"score": 1.0},
        "status": status,
        "metadata": {"mode": "rl"},
        "session_id": "s",
        "turn": seq,
    }
    s.update(extra)
    return {"seq": seq, "sample": s}


class FakeClient:
    """Mimics RolloutClient over an in-memory list of samples."""

    base_url = "http://fake"

    def __init__(self, samples: List[Dict[str, Any]], fail_commit: bool = False) -> None:
        self.samples = samples
        self.committed = 0
        self.commits: List[int] = []
        self.calls: List[str] = []
        self.fail_commit = fail_commit
        self.mode = "rl"
        self.enabled = False
        # Scores already drainable (e.g. turns scored while paused), and scores of turns scored
        # once submission is on again (they arrive with the first pull after resume).
        self.scores: List[float] = []
        self.incoming: List[float] = []
        self.pull_sizes: List[int] = []

    def status(self) -> Dict[str, Any]:
        self.calls.append("status")
        return {"committed_seq": self.committed, "mode": self.mode}

    def pull(self, after: int, max: int = 64, wait_ms: int = 0) -> Tuple[List[Dict[str, Any]], int]:
        self.pull_sizes.append(max)
        if self.enabled:
            self.scores += self.incoming
            self.incoming = []
        page = [s for s in self.samples if s["seq"] > after][:max]
        return page, max_seq(self.samples)

    def commit(self, through: int) -> Dict[str, Any]:
        if self.fail_commit:
            raise ConnectionError("commit failed")
        self.commits.append(through)
        self.committed = through
        return {"committed_seq": through, "last_seq": max_seq(self.samples)}

    def resume(self) -> Dict[str, Any]:
        self.calls.append("resume")
        self.enabled = True
        return {"submission_enabled": True}

    def pause(self) -> Dict[str, Any]:
        self.calls.append("pause")
        self.enabled = False
        return {"submission_enabled": False}

    def drain_eval_scores(self) -> Dict[str, Any]:
        self.calls.append("drain")
        s, self.scores = self.scores, []
        return {"count": len(s), "mean": (sum(s) / len(s)) if s else None, "scores": s}


def max_seq(samples: List[Dict[str, Any]]) -> int:
    return max((s["seq"] for s in samples), default=0)


def install(client: FakeClient, url: str = "http://fake") -> RolloutBridge:
    client.base_url = url
    bridge = RolloutBridge(client, wait_ms=0)  # type: ignore[arg-type]
    sr._BRIDGES[(url, None)] = bridge
    return bridge


def args(n: int) -> Any:
    return types.SimpleNamespace(
        rollout_batch_size=n, policy_serving_url="http://fake", policy_serving_timeout_sec=0.5
    )


def test_aborted_groups_are_skipped_but_consumed() -> None:
    c = FakeClient([api_sample(1), api_sample(2, "aborted"), api_sample(3), api_sample(4), api_sample(5)])
    c.incoming = [1.0, 0.0]
    install(c)
    out = generate_rollout(args(3), 0, None)
    assert [g[0]["index"] for g in out.samples] == [1, 3, 4]
    assert c.commits == [4], "the skipped aborted sample is committed with the batch, 5 is not"
    assert out.metrics == {"rollout/prm_eval_score": 0.5}
    out = generate_rollout(args(1), 1, None)
    assert [g[0]["index"] for g in out.samples] == [5]
    assert out.metrics is None


def test_failed_commit_keeps_everything_for_the_next_call() -> None:
    c = FakeClient([api_sample(i) for i in range(1, 5)], fail_commit=True)
    bridge = install(c)
    with pytest.raises(ConnectionError):
        generate_rollout(args(2), 0, None)
    assert [s["seq"] for s in bridge.carry] == [1, 2, 3, 4]
    assert c.calls[-1] == "pause", "submission is paused even when the rollout fails"
    c.fail_commit = False
    out = generate_rollout(args(2), 1, None)
    assert [g[0]["index"] for g in out.samples] == [1, 2]
    assert c.commits == [2]


def test_timeout_restores_carry_over() -> None:
    c = FakeClient([api_sample(1)])
    bridge = install(c)
    with pytest.raises(TimeoutError):
        generate_rollout(args(2), 0, None)
    assert [s["seq"] for s in bridge.carry] == [1] and c.commits == []


def test_eval_scores_are_reset_before_resume_so_the_metric_covers_this_rollout_only() -> None:
    c = FakeClient([api_sample(1), api_sample(2)])
    c.scores = [-1.0, -1.0, -1.0]  # scored while paused: not this rollout's samples
    c.incoming = [1.0, 0.0]  # scored while this rollout collects
    install(c)
    out = generate_rollout(args(2), 0, None)
    assert [x for x in c.calls if x != "status"] == ["drain", "resume", "pause", "drain"]
    assert out.metrics == {"rollout/prm_eval_score": 0.5}, "the pre-resume -1 scores are not counted"
    assert c.scores == []


def test_reset_happens_before_resume_even_when_no_score_arrives() -> None:
    c = FakeClient([api_sample(1)])
    c.scores = [1.0]
    install(c)
    out = generate_rollout(args(1), 0, None)
    assert out.metrics is None, "a score from before the resume is no metric of this rollout"


def test_plain_dicts_without_slime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "slime", None)  # makes `import slime...` fail
    s = api_sample(7, teacher_log_probs=[-0.1, -0.2])["sample"]
    (group,) = to_slime_groups([s])
    d = group[0]
    assert isinstance(d, dict)
    assert d["index"] == 7 and d["teacher_log_probs"] == [-0.1, -0.2]
    assert d["remove_sample"] is False and d["weight_versions"] == [] and d["label"] is None
    d["metadata"]["x"] = 1
    assert "x" not in s["metadata"], "the conversion copies"


@pytest.fixture
def fake_slime(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    @dataclasses.dataclass
    class Sample:
        class Status(enum.Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        group_index: Optional[int] = None
        index: Optional[int] = None
        prompt: Any = ""
        tokens: List[int] = dataclasses.field(default_factory=list)
        response: str = ""
        response_length: int = 0
        label: Optional[str] = None
        reward: Any = None
        loss_mask: Optional[List[int]] = None
        rollout_log_probs: Optional[List[float]] = None
        status: "Sample.Status" = Status.PENDING
        metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class RolloutFnTrainOutput:
        samples: List[List[Any]]
        metrics: Optional[Dict[str, Any]] = None

    mods = {
        "slime": types.ModuleType("slime"),
        "slime.utils": types.ModuleType("slime.utils"),
        "slime.utils.types": types.ModuleType("slime.utils.types"),
        "slime.rollout": types.ModuleType("slime.rollout"),
        "slime.rollout.base_types": types.ModuleType("slime.rollout.base_types"),
    }
    mods["slime.utils.types"].Sample = Sample  # type: ignore[attr-defined]
    mods["slime.rollout.base_types"].RolloutFnTrainOutput = RolloutFnTrainOutput  # type: ignore[attr-defined]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    yield Sample


def test_slime_samples_when_slime_is_importable(fake_slime: type) -> None:
    s = api_sample(
        3,
        teacher_log_probs=[-0.1, -0.2],
        teacher_topk_log_probs=[[-0.1, -1.0], [-0.2, -2.0]],
        teacher_topk_indices=[[5, 6], [7, 8]],
    )["sample"]
    obj = sample_to_slime(s)
    assert isinstance(obj, fake_slime)
    assert obj.status is fake_slime.Status.COMPLETED
    assert obj.index == obj.group_index == 3 and obj.reward == {"score": 1.0}
    assert obj.loss_mask == [1, 1] and obj.response_length == 2
    assert obj.session_id == "s" and obj.turn == 3  # extra fields become attributes
    assert obj.remove_sample is False  # Slime fields the stand-in lacks get their defaults
    try:
        import torch  # type: ignore
    except ImportError:
        assert obj.teacher_log_probs == [-0.1, -0.2]
        assert obj.teacher_topk_indices == [[5, 6], [7, 8]]
    else:
        assert obj.teacher_log_probs.dtype == torch.float32
        assert obj.teacher_topk_log_probs.shape == (2, 2)
        assert obj.teacher_topk_indices.dtype == torch.int64


def test_slime_torch_tensors(fake_slime: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stand-in torch module: teacher fields are built as float32 / int64 tensors."""
    made: List[Tuple[Any, Any]] = []
    torch = types.ModuleType("torch")
    torch.float32 = "float32"  # type: ignore[attr-defined]
    torch.int64 = "int64"  # type: ignore[attr-defined]
    torch.tensor = lambda data, dtype=None: made.append((data, dtype)) or ("T", dtype)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    s = api_sample(1, teacher_log_probs=[None, -0.2], teacher_topk_indices=[[1], [2]])["sample"]
    obj = sample_to_slime(s)
    assert obj.teacher_log_probs == ("T", "float32")
    assert obj.teacher_topk_indices == ("T", "int64")
    assert made[0][0][0] != made[0][0][0], "a JSON null (NaN) becomes NaN"
    assert obj.rollout_log_probs == [-0.5, -0.25], "only teacher fields become tensors"


def test_generate_rollout_returns_slime_output(fake_slime: type) -> None:
    c = FakeClient([api_sample(1), api_sample(2)])
    install(c)
    out = generate_rollout(args(2), 0, None)
    assert type(out).__name__ == "RolloutFnTrainOutput"
    assert all(isinstance(g[0], fake_slime) for g in out.samples)
    assert [g[0].index for g in out.samples] == [1, 2]


def test_evaluation_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="evaluation"):
        generate_rollout(args(1), 0, None, evaluation=True)
