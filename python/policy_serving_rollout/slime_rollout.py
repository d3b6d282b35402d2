"""Slime rollout function: ``--rollout-function-path policy_serving_rollout.generate_rollout``.

Each call, in the reference's order: reset the eval scores, resume submission, pull (long-poll)
until ``args.rollout_batch_size`` groups, skip aborted samples, commit through the highest seq
consumed, pause submission, convert, and return the groups with the ``rollout/prm_eval_score``
metric of exactly this rollout. ``evaluation=True`` runs Slime's own evaluation rollout.

Nothing pulled is lost: samples pulled beyond the batch size stay in the bridge's carry-over
buffer (uncommitted on the server) and are returned first by the next call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .client import PulledSample, RolloutClient
from .config import OperatorConfig, load_for
from .convert import to_slime_groups

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:30000"
URL_ENV = "POLICY_SERVING_URL"
ADMIN_KEY_ENV = "POLICY_SERVING_ADMIN_KEY"
METRIC = "rollout/prm_eval_score"
STALE_METRIC = "rollout/stale_samples_skipped"
MAX_PAGE = 1024


@dataclass
class RolloutOutput:
    """Stand-in for Slime's ``RolloutFnTrainOutput`` when Slime is not importable."""

    samples: List[List[Any]]
    metrics: Optional[Dict[str, Any]] = None


@dataclass
class Batch:
    """What :meth:`RolloutBridge.next_batch` consumed."""

    samples: List[PulledSample]  # returned, in seq order
    skipped: List[PulledSample] = field(default_factory=list)  # aborted, consumed, not returned
    committed_seq: Optional[int] = None
    # more than ``max_staleness`` policy versions behind the trainer: consumed, not returned
    stale: List[PulledSample] = field(default_factory=list)


def _version_number(version: Any) -> Optional[int]:
    """The integer a policy version ends with (``"12"``, ``"step-12"``), or ``None``."""
    digits = ""
    for ch in reversed(str(version)):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


def is_stale(sample: Dict[str, Any], current: Optional[str], max_staleness: Optional[int]) -> bool:
    """Whether ``sample`` was produced more than ``max_staleness`` versions before ``current``.

    Versions compare by the integer they end with; a sample (or trainer) without a numbered
    version is never stale: there is nothing to compare.
    """
    if max_staleness is None or current is None:
        return False
    now = _version_number(current)
    versions = sample.get("weight_versions") or []
    then = _version_number(versions[-1]) if versions else None
    return now is not None and then is not None and now - then > max_staleness


class RolloutBridge:
    """Pull cursor plus carry-over buffer over one :class:`RolloutClient`.

    ``cursor`` is the highest seq pulled so far (``None``: start from the server's
    ``committed_seq``). ``carry`` holds pulled samples not yet returned; they are never committed
    until returned, so a crashed trainer gets them again from the server.
    """

    def __init__(
        self,
        client: RolloutClient,
        page_size: int = 64,
        wait_ms: int = 5000,
        max_carry: Optional[int] = None,
    ) -> None:
        self.client = client
        self.page_size = page_size
        self.wait_ms = wait_ms
        # Bound on the samples pulled beyond a batch (config.toml rollout.output_queue_size):
        # a pull never asks for more than the batch still needs plus this.
        self.max_carry = max_carry
        self.mode_checked = False
        self.cursor: Optional[int] = None
        self.carry: List[PulledSample] = []
        self._lock = threading.Lock()

    def next_batch(
        self,
        n: int,
        timeout_sec: Optional[float] = None,
        current_version: Optional[str] = None,
        max_staleness: Optional[int] = None,
    ) -> Batch:
        """Consume ``n`` non-aborted samples (carry-over first) and commit through the last one.

        ``timeout_sec`` (``None``: wait forever, like the reference) bounds the wait; on time-out
        a ``TimeoutError`` is raised and everything consumed so far goes back to the carry-over.
        With ``max_staleness`` (off by default), samples more than that many policy versions
        behind ``current_version`` are consumed but not returned (:func:`is_stale`).
        """
        with self._lock:
            return self._next_batch(n, timeout_sec, current_version, max_staleness)

    def _next_batch(
        self,
        n: int,
        timeout_sec: Optional[float],
        current_version: Optional[str] = None,
        max_staleness: Optional[int] = None,
    ) -> Batch:
        if self.cursor is None:
            self.cursor = int(self.client.status().get("committed_seq") or 0)
        consumed: List[PulledSample] = []
        taken: List[PulledSample] = []
        skipped: List[PulledSample] = []
        stale: List[PulledSample] = []
        start = last_progress = time.monotonic()
        try:
            while len(taken) < n:
                if not self.carry:
                    extra = self.page_size
                    if self.max_carry is not None:
                        extra = min(extra, self.max_carry)
                    want = min(MAX_PAGE, max(extra, n - len(taken)))
                    wait = self.wait_ms
                    if timeout_sec is not None:
                        left = timeout_sec - (time.monotonic() - start)
                        if left <= 0:
                            raise TimeoutError(
                                f"{self.client.base_url}: only {len(taken)} of {n} samples "
                                f"after {timeout_sec:.1f}s"
                            )
                        wait = max(0, min(wait, int(left * 1000)))
                    page, _ = self.client.pull(self.cursor, max=want, wait_ms=wait)
                    for item in page:
                        seq = int(item["seq"])
                        if seq > self.cursor:  # a server never repeats, but be safe
                            self.carry.append(item)
                            self.cursor = seq
                    if page:
                        last_progress = time.monotonic()
                    elif time.monotonic() - last_progress > 30:
                        log.info("policy-serving: waiting for samples, %d/%d so far", len(taken), n)
                        last_progress = time.monotonic()
                    continue
                item = self.carry.pop(0)
                consumed.append(item)
                if (item.get("sample") or {}).get("status") == "aborted":
                    skipped.append(item)
                    continue
                if is_stale(item.get("sample") or {}, current_version, max_staleness):
                    stale.append(item)
                    continue
                taken.append(item)
            committed: Optional[int] = None
            if consumed:
                through = max(int(c["seq"]) for c in consumed)
                reply = self.client.commit(through)
                committed = int(reply.get("committed_seq", through))
        except BaseException:
            # Nothing is lost: what was consumed goes back in front of the carry-over.
            self.carry[:0] = consumed
            raise
        return Batch(samples=taken, skipped=skipped, committed_seq=committed, stale=stale)


_BRIDGES: Dict[Tuple[str, Optional[str]], RolloutBridge] = {}
_BRIDGES_LOCK = threading.Lock()


def get_bridge(
    base_url: str, admin_key: Optional[str] = None, **kwargs: Any
) -> RolloutBridge:
    """The process-wide bridge of ``base_url`` (its carry-over survives between rollout calls)."""
    key = (base_url.rstrip("/"), admin_key)
    with _BRIDGES_LOCK:
        bridge = _BRIDGES.get(key)
        if bridge is None:
            bridge = RolloutBridge(RolloutClient(base_url, admin_key=admin_key), **kwargs)
            _BRIDGES[key] = bridge
        return bridge


def reset_bridges() -> None:
    """Forget every bridge (cursor and carry-over), as a restarted trainer would."""
    with _BRIDGES_LOCK:
        _BRIDGES.clear()


def _server_url(args: Any, cfg: Optional[OperatorConfig] = None) -> str:
    return (
        getattr(args, "policy_serving_url", None)
        or os.environ.get(URL_ENV)
        or (cfg.api_server_url if cfg is not None else None)
        or DEFAULT_URL
    )


def _timeout(args: Any) -> Optional[float]:
    """Only an explicit ``args.policy_serving_timeout_sec`` bounds the wait for a batch. The
    config file's ``rollout.sample_timeout_sec`` is the server's session timeout, deliberately not
    read here: a rollout that waited only that long would stop a training run whenever live
    traffic is slow, where the reference waits for as long as it takes."""
    explicit = getattr(args, "policy_serving_timeout_sec", None)
    return None if explicit is None else float(explicit)


def _output(groups: List[List[Any]], metrics: Optional[Dict[str, Any]]) -> Any:
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput  # type: ignore
    except ImportError:
        return RolloutOutput(samples=groups, metrics=metrics)
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def eval_rollout(args: Any, rollout_id: int) -> Any:
    """Slime's own evaluation rollout, as the reference runs it.

    ``slime.rollout.sglang_rollout.eval_rollout(args, rollout_id)`` (a coroutine returning
    ``(RolloutFnEvalOutput, [])``) run on Slime's loop (``slime.utils.async_utils.run``); its
    output is returned. Not ``sglang_rollout.generate_rollout(..., evaluation=True)``: that one
    asserts ``args.rollout_global_dataset``, which the reference's scripts turn off
    (``--disable-rollout-global-dataset``).
    """
    try:
        from slime.rollout.sglang_rollout import eval_rollout as slime_eval  # type: ignore
        from slime.utils.async_utils import run  # type: ignore
    except ImportError as e:
        raise RuntimeError(
            "policy_serving_rollout.generate_rollout(evaluation=True) runs Slime's own evaluation "
            "rollout (slime.rollout.sglang_rollout.eval_rollout), but Slime is not importable "
            f"here ({e}): run it inside Slime's training process, with Slime installed"
        ) from e
    output, _ = run(slime_eval(args, rollout_id))
    return output


def generate_rollout(
    args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False
) -> Any:
    """Slime rollout function backed by a policy-serving server.

    Reads ``args.rollout_batch_size``; optional ``args.policy_serving_url`` (else env
    ``POLICY_SERVING_URL``, else config.toml ``rollout.api_server_url``, else
    ``http://127.0.0.1:30000``), ``args.policy_serving_wait_ms`` (long-poll per request, default
    5000), ``args.policy_serving_timeout_sec`` (else wait forever, like the reference), ``args.policy_serving_config`` (else env ``POLICY_SERVING_CONFIG``: the
    operators' config.toml, see :mod:`policy_serving_rollout.config`). The admin key comes from
    env ``POLICY_SERVING_ADMIN_KEY``. ``args.policy_serving_weight_version``: the policy version
    the trainer has loaded, announced at resume (stamped on streamed samples);
    ``args.policy_serving_max_weight_staleness`` (off by default): skip samples more than that
    many versions behind it, reported as ``rollout/stale_samples_skipped``.

    Returns Slime's ``RolloutFnTrainOutput`` (or :class:`RolloutOutput` without Slime) with
    ``samples`` a list of groups of one and ``metrics`` ``{"rollout/prm_eval_score": mean}`` when
    eval scores were collected during this call, else ``None``. With ``evaluation=True``: Slime's
    own evaluation rollout (:func:`eval_rollout`), as in the reference.
    """
    if evaluation:
        return eval_rollout(args, rollout_id)
    cfg = load_for(args)
    n = int(args.rollout_batch_size)
    url = _server_url(args, cfg)
    bridge = get_bridge(
        url,
        os.environ.get(ADMIN_KEY_ENV) or None,
        wait_ms=int(getattr(args, "policy_serving_wait_ms", None) or 5000),
    )
    bridge.max_carry = cfg.output_queue_size if cfg is not None else None
    client = bridge.client
    if cfg is not None and not bridge.mode_checked:
        cfg.check_server_mode(client.status().get("mode"), client.base_url)
        bridge.mode_checked = True
    # As the reference: reset the scores, then resume, so that the metric covers exactly the
    # samples scored while this rollout collected (not those scored while paused).
    client.drain_eval_scores()
    # The policy version the trainer has loaded: explicit, else the rollout id (Slime updates the
    # weights between rollouts), so streamed samples are stamped with the version they came from.
    version = getattr(args, "policy_serving_weight_version", None)
    version = str(rollout_id) if version is None else str(version)
    client.resume(version)
    max_staleness = getattr(args, "policy_serving_max_weight_staleness", None)
    try:
        batch = bridge.next_batch(
            n,
            timeout_sec=_timeout(args),
            current_version=version,
            max_staleness=None if max_staleness is None else int(max_staleness),
        )
    finally:
        try:
            client.pause()
        except Exception:  # do not hide the original error
            log.exception("policy-serving: pause failed")
    scores = client.drain_eval_scores()
    metrics: Optional[Dict[str, Any]] = None
    if int(scores.get("count") or 0) > 0 and scores.get("mean") is not None:
        metrics = {METRIC: float(scores["mean"])}
    if batch.skipped:
        log.info("policy-serving: skipped %d aborted samples", len(batch.skipped))
    if max_staleness is not None:
        metrics = dict(metrics or {})
        metrics[STALE_METRIC] = len(batch.stale)
        if batch.stale:
            log.info(
                "policy-serving: skipped %d samples more than %s policy versions behind %s",
                len(batch.stale),
                max_staleness,
                version,
            )
    groups = to_slime_groups([item["sample"] for item in batch.samples])
    return _output(groups, metrics)
