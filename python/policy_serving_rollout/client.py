"""A small, dependency-free client for the trainer-facing rollout API.

Routes (see docs/rollout-api.md): ``GET /v1/rollout/samples``, ``POST /v1/rollout/commit``,
``POST /v1/rollout/pause`` / ``resume``, ``GET /v1/rollout/status``,
``POST /v1/rollout/eval-scores/drain``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Tuple

try:  # optional: half the bytes of JSON and much faster for top-K samples
    import msgpack  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    msgpack = None

PulledSample = Dict[str, Any]  # {"seq": int, "sample": {...}}


class RolloutError(Exception):
    """Base class of the errors raised by :class:`RolloutClient`."""


class RolloutConnectionError(RolloutError):
    """The server could not be reached (refused, timed out, DNS...)."""

    def __init__(self, method: str, url: str, reason: object) -> None:
        self.method = method
        self.url = url
        self.reason = reason
        super().__init__(f"{method} {url}: cannot reach the policy-serving server: {reason}")


class RolloutAPIError(RolloutError):
    """The server answered with an HTTP error status.

    ``code`` and ``message`` come from the OpenAI-shaped body ``{"error": {"code", "message"}}``
    when the server sent one.
    """

    def __init__(
        self,
        method: str,
        url: str,
        status: int,
        code: Optional[str],
        message: str,
        body: str = "",
    ) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        what = f"{code}: {message}" if code else message
        super().__init__(f"{method} {url} -> HTTP {status}: {what}")


def _parse_error(raw: bytes) -> Tuple[Optional[str], str]:
    text = raw.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return None, text.strip()[:500] or "(empty body)"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        code = err.get("code") or err.get("type")
        return (str(code) if code is not None else None), str(err.get("message", text))
    if isinstance(err, str):
        return None, err
    return None, text.strip()[:500]


class RolloutClient:
    """Client of one policy-serving server's ``/v1/rollout/*`` API.

    :param base_url: server root, e.g. ``http://127.0.0.1:30000``.
    :param admin_key: sent as ``Authorization: Bearer <key>`` (``server.admin_key_env``).
    :param timeout: socket timeout in seconds; a long-poll adds its ``wait_ms`` to it.
    :param use_msgpack: pull pages as MessagePack (default: when ``msgpack`` is installed).
    :param consumer: this reader's name in the Redis consumer group (``store.kind = "redis"``;
        default ``trainer``). Several trainer workers pulling under different names get different
        samples, and a dead worker's samples go to the next one that pulls. Ignored by the
        embedded store.
    """

    def __init__(
        self,
        base_url: str,
        admin_key: Optional[str] = None,
        timeout: float = 30.0,
        use_msgpack: Optional[bool] = None,
        consumer: Optional[str] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.consumer = consumer
        self.admin_key = admin_key
        self.timeout = timeout
        if use_msgpack and msgpack is None:
            raise RolloutError("use_msgpack=True needs the 'msgpack' package (pip install msgpack)")
        self.use_msgpack = (msgpack is not None) if use_msgpack is None else use_msgpack

    def __repr__(self) -> str:
        return f"RolloutClient({self.base_url!r})"

    # -- transport -----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        query: Optional[Mapping[str, Any]] = None,
        body: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        msgpack_reply: bool = False,
        raw_reply: bool = False,
    ) -> Any:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/msgpack" if msgpack_reply else "application/json"}
        data: Optional[bytes] = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        elif method == "POST":
            data = b""
        if self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw_err = e.read() if e.fp is not None else b""
            code, message = _parse_error(raw_err)
            raise RolloutAPIError(
                method, url, e.code, code, message, raw_err.decode("utf-8", "replace")
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RolloutConnectionError(method, url, reason) from None
        if raw_reply:
            return raw
        try:
            if "msgpack" in ctype:
                if msgpack is None:
                    raise RolloutError(f"{method} {url}: got MessagePack but msgpack is not installed")
                return msgpack.unpackb(raw, raw=False, strict_map_key=False)
            return json.loads(raw.decode("utf-8")) if raw else {}
        except (ValueError, TypeError) as e:
            raise RolloutError(f"{method} {url}: undecodable reply: {e}") from None

    # -- API -----------------------------------------------------------------------------------

    def pull(
        self, after: int, max: int = 64, wait_ms: int = 0  # noqa: A002 - mirrors the API
    ) -> Tuple[List[PulledSample], int]:
        """Samples with ``seq > after`` (at most ``max``), long-polling up to ``wait_ms``.

        Returns ``(samples, last_seq)`` where each sample is ``{"seq": S, "sample": {...}}``.
        """
        query: Dict[str, Any] = {"after": int(after), "max": int(max), "wait_ms": int(wait_ms)}
        if self.use_msgpack:
            query["format"] = "msgpack"
        if self.consumer:
            query["consumer"] = self.consumer
        page = self._request(
            "GET",
            "/v1/rollout/samples",
            query=query,
            timeout=self.timeout + wait_ms / 1000.0,
            msgpack_reply=self.use_msgpack,
        )
        samples = list(page.get("samples") or [])
        self._attach_images(samples, page.get("images") or {})
        return samples, int(page.get("last_seq") or 0)

    def blob(self, image_hash: str) -> bytes:
        """The bytes of an image a kept sample references (``sample["images"][i]["hash"]``)."""
        return self._request(
            "GET", "/v1/rollout/blobs/" + urllib.parse.quote(image_hash), raw_reply=True
        )

    def _attach_images(self, samples: List[PulledSample], inline: Mapping[str, bytes]) -> None:
        """Puts each referenced image's bytes in its entry (``images[i]["bytes"]``) and a
        sample's routed experts' blocks, joined, in ``rollout_routed_experts["bytes"]``: from the
        page when it carries them (MessagePack), else fetched once per hash."""
        fetched: Dict[str, bytes] = dict(inline)

        def get(h: str) -> bytes:
            if h not in fetched:
                fetched[h] = self.blob(h)
            return fetched[h]

        for item in samples:
            sample = item.get("sample") or {}
            for image in sample.get("images") or []:
                image["bytes"] = get(image["hash"])
            # Routed experts: their blocks, joined in order (convert.routed_experts_array reads them).
            experts = sample.get("rollout_routed_experts")
            if isinstance(experts, dict) and "bytes" not in experts:
                experts["bytes"] = b"".join(get(h) for h in experts.get("blocks") or [])

    def commit(self, through: int) -> Dict[str, Any]:
        """Mark every sample with ``seq <= through`` consumed. Returns ``{"committed_seq", "last_seq"}``.

        Over Redis, only the samples this client's ``consumer`` was given are acknowledged.
        """
        body: Dict[str, Any] = {"through": int(through)}
        if self.consumer:
            body["consumer"] = self.consumer
        return self._request("POST", "/v1/rollout/commit", body=body)

    def pause(self) -> Dict[str, Any]:
        """Stop collecting samples (weight update). Returns ``{"submission_enabled": False}``."""
        return self._request("POST", "/v1/rollout/pause")

    def resume(self, weight_version: Optional[str] = None) -> Dict[str, Any]:
        """Collect samples again. Returns ``{"submission_enabled": True, "weight_version"}``.

        ``weight_version``: the policy version the trainer has just loaded; the server stamps it on
        samples whose answer carries none (streamed answers).
        """
        if weight_version is None:
            return self._request("POST", "/v1/rollout/resume")
        return self._request(
            "POST", "/v1/rollout/resume", body={"weight_version": str(weight_version)}
        )

    def status(self) -> Dict[str, Any]:
        """The server's rollout status (``committed_seq``, ``last_seq``, ``pending``...)."""
        return self._request("GET", "/v1/rollout/status")

    def drain_eval_scores(self) -> Dict[str, Any]:
        """``{"count", "mean", "scores"}`` collected since the last drain; the server clears them."""
        return self._request("POST", "/v1/rollout/eval-scores/drain")
