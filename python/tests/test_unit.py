"""Unit tests with a fake client: aborted groups, carry-over on failure, Slime conversion."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import sys
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import policy_serving_rollout.slime_hooks as hooks
import policy_serving_rollout.slime_rollout as sr
from policy_serving_rollout import (
    ConfigError,
    RolloutBridge,
    config,
    generate_rollout,
    reward_func,
    sample_to_slime,
    to_slime_groups,
)


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

    def resume(self, weight_version: Optional[str] = None) -> Dict[str, Any]:
        self.calls.append("resume")
        self.announced = weight_version
        self.enabled = True
        return {"submission_enabled": True, "weight_version": weight_version}

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


# -- evaluation: Slime's own eval rollout ---------------------------------------------------------


@pytest.fixture
def fake_slime_eval(fake_slime: type, monkeypatch: pytest.MonkeyPatch) -> Iterator[List[Any]]:
    """Stand-ins for slime.rollout.sglang_rollout.eval_rollout and slime.utils.async_utils.run."""
    seen: List[Any] = []

    async def eval_rollout(a: Any, rollout_id: int) -> Tuple[Any, List[Any]]:
        seen.append(("eval_rollout", a, rollout_id))
        return ("EVAL-OUTPUT", [])

    def run(coro: Any) -> Any:
        seen.append(("run",))
        return asyncio.run(coro)

    rollout_mod = types.ModuleType("slime.rollout.sglang_rollout")
    rollout_mod.eval_rollout = eval_rollout  # type: ignore[attr-defined]
    async_mod = types.ModuleType("slime.utils.async_utils")
    async_mod.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", rollout_mod)
    monkeypatch.setitem(sys.modules, "slime.utils.async_utils", async_mod)
    yield seen


def test_evaluation_runs_slimes_own_eval_rollout(fake_slime_eval: List[Any]) -> None:
    c = FakeClient([api_sample(1)])
    install(c)
    a = args(1)
    out = generate_rollout(a, 7, None, evaluation=True)
    assert out == "EVAL-OUTPUT", "the eval output of Slime's eval_rollout, not the (output, []) pair"
    assert fake_slime_eval == [("run",), ("eval_rollout", a, 7)]
    assert c.calls == [] and c.commits == [], "an eval rollout neither resumes nor takes samples"


def test_evaluation_without_slime_says_slime_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "slime", None)
    with pytest.raises(RuntimeError, match="Slime is not importable") as e:
        generate_rollout(args(1), 0, None, evaluation=True)
    assert "slime.rollout.sglang_rollout.eval_rollout" in str(e.value)


# -- reward_func: --custom-rm-path ------------------------------------------------------------------


def test_reward_func_gives_the_servers_score_under_the_reward_key() -> None:
    a = types.SimpleNamespace(reward_key="score", eval_reward_key=None)
    s = types.SimpleNamespace(reward={"score": -1.0, "other": 5})
    assert asyncio.run(reward_func(a, s)) == {"score": -1.0}
    # Slime reads it back as reward[reward_key], as with the reference's reward_func
    assert asyncio.run(reward_func(a, s))[a.reward_key] == -1.0
    plain = types.SimpleNamespace(reward_key=None, eval_reward_key=None)
    assert asyncio.run(reward_func(plain, s)) == -1.0
    assert asyncio.run(reward_func(plain, types.SimpleNamespace(reward=0.5))) == 0.5
    both = types.SimpleNamespace(reward_key="score", eval_reward_key="acc")
    assert asyncio.run(reward_func(both, s)) == {"score": -1.0, "acc": -1.0}


def test_reward_func_batches_and_samples_without_reward(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks, "_warned_no_reward", False)
    a = types.SimpleNamespace(reward_key="score")
    group = [types.SimpleNamespace(reward={"score": 1.0}), types.SimpleNamespace(reward=None)]
    with caplog.at_level("WARNING"):
        assert asyncio.run(reward_func(a, group)) == [{"score": 1.0}, {"score": 0.0}]
        assert asyncio.run(reward_func(a, types.SimpleNamespace(reward=None))) == {"score": 0.0}
    warned = [r for r in caplog.records if "has no reward" in r.getMessage()]
    assert len(warned) == 1, "one warning, not one per sample"


# -- the operators' config.toml -------------------------------------------------------------------

# The operators' file as they write it (../shared/docs/operator-guide-facts.md).
OPERATORS_CONFIG = """
[rollout]
mode = "openclaw"
api_server_url = "{url}"
output_queue_size = 256
sample_timeout_sec = 300

[policy]
model_name = "qwen3-4b"
served_model_name = "qwen3-4b"
tp_size = 2

[reward]
prm_enabled = true
prm_num_votes = 3

[opd]
enabled = true
teacher_base_url = "https://taotoken.net/api"
teacher_api_key_env = "TAOTOKEN_API_KEY"
teacher_model = "claude-sonnet-4-20250514"
top_k = 20
"""


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("POLICY_SERVING_URL", "POLICY_SERVING_CONFIG", "POLICY_SERVING_ADMIN_KEY"):
        monkeypatch.delenv(k, raising=False)


def cfg_args(path: Path, n: int = 1, **kw: Any) -> Any:
    return types.SimpleNamespace(rollout_batch_size=n, policy_serving_config=str(path), **kw)


def test_operators_config_toml_is_read_as_written(tmp_path: Path, no_env: None) -> None:
    path = tmp_path / "config.toml"
    path.write_text(OPERATORS_CONFIG.format(url="http://from-config:30000"))
    cfg = config.load(path)
    assert (cfg.mode, cfg.api_server_url, cfg.output_queue_size, cfg.sample_timeout_sec) == (
        "openclaw",
        "http://from-config:30000",
        256,
        300.0,
    )
    assert cfg.opd_enabled is True
    c = FakeClient([api_sample(1), api_sample(2)])
    c.mode = "opd"
    install(c, "http://from-config:30000")
    out = generate_rollout(cfg_args(path, 2), 0, None)
    assert [g[0]["index"] for g in out.samples] == [1, 2], "the URL comes from rollout.api_server_url"


def test_config_toml_from_env_and_explicit_args_win(
    tmp_path: Path, no_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[rollout]\napi_server_url = "http://from-config"\nsample_timeout_sec = 0.2\n')
    monkeypatch.setenv("POLICY_SERVING_CONFIG", str(path))
    c = FakeClient([api_sample(1)])
    install(c, "http://from-config")
    with pytest.raises(TimeoutError):  # the URL comes from the file; the explicit bound applies
        generate_rollout(
            types.SimpleNamespace(rollout_batch_size=2, policy_serving_timeout_sec=0.2), 0, None
        )
    # rollout.sample_timeout_sec is the server's session timeout: it never bounds the wait for a
    # batch (a slow stretch of live traffic must not stop the training run).
    assert sr.load_for(types.SimpleNamespace()).sample_timeout_sec == 0.2
    assert sr._timeout(types.SimpleNamespace()) is None
    other = FakeClient([api_sample(1), api_sample(2)])
    install(other, "http://explicit")
    a = types.SimpleNamespace(
        rollout_batch_size=2, policy_serving_url="http://explicit", policy_serving_timeout_sec=5
    )
    out = generate_rollout(a, 1, None)
    assert [g[0]["index"] for g in out.samples] == [1, 2] and other.commits == [2]


def test_output_queue_size_bounds_the_carry_over(tmp_path: Path, no_env: None) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[rollout]\napi_server_url = "http://q"\noutput_queue_size = 3\n')
    c = FakeClient([api_sample(i) for i in range(1, 11)])
    bridge = install(c, "http://q")
    got: List[int] = []
    for rid in range(10):
        out = generate_rollout(cfg_args(path, 1, policy_serving_timeout_sec=5), rid, None)
        got += [g[0]["index"] for g in out.samples]
        assert len(bridge.carry) <= 3, f"carry-over {len(bridge.carry)} > rollout.output_queue_size"
    assert got == list(range(1, 11)), "nothing lost, nothing repeated"
    assert max(c.pull_sizes) == 3


def test_server_mode_is_checked_against_rollout_mode(tmp_path: Path, no_env: None) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[rollout]\nmode = "opd"\napi_server_url = "http://m"\n')
    c = FakeClient([api_sample(1)])
    install(c, "http://m")
    with pytest.raises(ConfigError) as e:
        generate_rollout(cfg_args(path), 0, None)
    msg = str(e.value)
    assert "rollout.mode = 'opd'" in msg and "'rl'" in msg and str(path) in msg and "http://m" in msg
    assert "resume" not in c.calls and "drain" not in c.calls, "nothing changes on a wrong server"
    # openclaw + opd.enabled = false expects rl: accepted
    path.write_text('[rollout]\nmode = "openclaw"\napi_server_url = "http://m"\n[opd]\nenabled = false\n')
    out = generate_rollout(cfg_args(path), 0, None)
    assert [g[0]["index"] for g in out.samples] == [1]
    path.write_text('[rollout]\nmode = "openclaw"\napi_server_url = "http://m2"\n[opd]\nenabled = true\n')
    install(FakeClient([api_sample(1)]), "http://m2")
    with pytest.raises(ConfigError, match="opd.enabled = true"):
        generate_rollout(cfg_args(path), 0, None)


def test_unknown_keys_are_errors_naming_them(tmp_path: Path, no_env: None) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        OPERATORS_CONFIG.format(url="http://u")
        + "\nbatch_size = 1\n[training]\nlr = 1e-5\n[sglang]\nchat_url = \"x\"\n"
    )
    # a top-level key after [opd] belongs to [opd]: opd.batch_size
    c = FakeClient([api_sample(1)])
    install(c, "http://u")
    with pytest.raises(ConfigError) as e:
        generate_rollout(cfg_args(path), 0, None)
    msg = str(e.value)
    assert "opd.batch_size" in msg and "sglang.chat_url" in msg and str(path) in msg
    assert "training" not in msg.split("Known keys")[0], "[training] is the trainer's table"
    assert c.calls == []


def test_trainer_side_keys_are_not_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[policy]\ntp_size = 4\n[training]\nlr = 1e-5\nglobal_batch_size = 16\n')
    cfg = config.load(path)
    assert cfg.mode is None and cfg.api_server_url is None
    assert config.sides("policy.tp_size") == ("trainer",) and config.sides("training.lr") == ("trainer",)
    assert config.sides("rollout.output_queue_size") == ("bridge",)
    assert config.sides("rollout.nope") == ()


@pytest.mark.parametrize(
    "text,key",
    [
        ("[rollout]\noutput_queue_size = 0\n", "rollout.output_queue_size"),
        ('[rollout]\noutput_queue_size = "256"\n', "rollout.output_queue_size"),
        ("[rollout]\nsample_timeout_sec = -1\n", "rollout.sample_timeout_sec"),
        ("[rollout]\nsample_timeout_sec = true\n", "rollout.sample_timeout_sec"),
        ('[rollout]\napi_server_url = "127.0.0.1:30000"\n', "rollout.api_server_url"),
        ('[rollout]\nmode = "ppo"\n', "rollout.mode"),
        ('[opd]\nenabled = "yes"\n', "opd.enabled"),
        ("rollout = 1\n", "rollout"),
        ("[rollout\n", "not valid TOML"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert key in str(e.value) and str(path) in str(e.value)


def test_missing_config_file_names_path_and_source(
    tmp_path: Path, no_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("POLICY_SERVING_CONFIG", str(missing))
    with pytest.raises(ConfigError) as e:
        generate_rollout(types.SimpleNamespace(rollout_batch_size=1), 0, None)
    assert str(missing) in str(e.value) and "POLICY_SERVING_CONFIG" in str(e.value)


def test_every_known_key_is_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for key, (who, _) in config.CONFIG_KEYS.items():
        row = [line for line in readme.splitlines() if line.startswith(f"| `{key}` |")]
        assert row, f"python/README.md has no row for {key}"
        assert all(side in row[0] for side in who), f"README row of {key} must say {who}"


def test_samples_too_many_versions_behind_are_skipped_and_reported() -> None:
    c = FakeClient(
        [
            api_sample(1, weight_versions=["step-3"]),  # 4 behind: stale
            api_sample(2, weight_versions=["step-5"]),  # 2 behind: kept
            api_sample(3),  # no version: kept (nothing to compare)
            api_sample(4, weight_versions=["7"]),
        ]
    )
    install(c)
    a = args(3)
    a.policy_serving_weight_version = "step-7"
    a.policy_serving_max_weight_staleness = 2
    out = generate_rollout(a, 0, None)
    assert c.announced == "step-7", "the version is announced at resume"
    assert [g[0]["index"] for g in out.samples] == [2, 3, 4]
    assert c.commits == [4], "the stale sample is consumed with the batch"
    assert out.metrics == {"rollout/stale_samples_skipped": 1}


def test_staleness_is_off_by_default() -> None:
    c = FakeClient([api_sample(1, weight_versions=["0"]), api_sample(2, weight_versions=["100"])])
    install(c)
    a = args(2)
    a.policy_serving_weight_version = "100"
    out = generate_rollout(a, 0, None)
    assert [g[0]["index"] for g in out.samples] == [1, 2]
    assert out.metrics is None
