"""Slime's per-sample hooks, as the reference's launch scripts use them.

- ``--custom-generate-function-path policy_serving_rollout.generate``: :func:`generate` renders the
  prompt with the policy's chat template, calls SGLang ``POST /generate`` with
  ``return_logprob: true`` and fills the sample's tokens, response, log-probs, loss mask and status.
  Slime calls it for the samples it generates itself (its evaluation rollout); training samples
  come from the policy-serving server.
- ``--custom-rm-path policy_serving_rollout.reward_func``: :func:`reward_func` gives the score in
  ``sample.reward`` (0.0 for a sample without one, as in the reference).

Both are coroutines: Slime awaits them (``slime/rollout/sglang_rollout.py``,
``slime/rollout/rm_hub/__init__.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from .client import RolloutError
from .convert import slime_sample_class

log = logging.getLogger(__name__)

CHAT_TEMPLATE_INSTALL = "pip install 'policy_serving_rollout[chat-template]' (transformers and jinja2)"

_TOKENIZERS: Dict[str, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()
_warned_no_reward = False


class GenerateError(RolloutError):
    """SGLang's ``/generate`` could not be used; the message names the URL and what to fix."""


def _import_transformers() -> Optional[Any]:
    try:
        import transformers  # type: ignore[import-not-found]
    except ImportError:
        return None
    return transformers


def load_tokenizer(path: str) -> Any:
    """The policy's HF tokenizer at ``path`` (``args.hf_checkpoint``), loaded once per path."""
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(path)
        if tok is None:
            transformers = _import_transformers()
            if transformers is None:
                raise GenerateError(
                    "policy_serving_rollout.generate renders the prompt with the policy's chat "
                    "template and needs the 'transformers' package: "
                    f"{CHAT_TEMPLATE_INSTALL}; or give it prompts already rendered as strings "
                    "(Slime's --apply-chat-template)"
                )
            tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)
            _TOKENIZERS[path] = tok
        return tok


def reset_tokenizers() -> None:
    """Forget the loaded tokenizers."""
    with _TOKENIZERS_LOCK:
        _TOKENIZERS.clear()


def _template_kwargs(args: Any, sample: Any) -> Dict[str, Any]:
    kwargs = getattr(sample, "apply_chat_template_kwargs", None) or getattr(
        args, "apply_chat_template_kwargs", None
    )
    return dict(kwargs or {})


def prompt_ids(args: Any, sample: Any) -> Optional[List[int]]:
    """The prompt's token ids, or ``None`` when SGLang must tokenize a string prompt itself.

    A list of messages is rendered with the policy's chat template (``args.hf_checkpoint``'s
    tokenizer, generation prompt added, ``apply_chat_template_kwargs`` of the sample or of
    ``args`` passed on) and tokenized without special tokens, as HF's
    ``apply_chat_template(tokenize=True)`` does. A string is taken as already rendered: tokenized
    like Slime's own ``generate`` when the tokenizer is at hand, else left to SGLang.
    """
    prompt = sample.prompt
    path = getattr(args, "hf_checkpoint", None)
    if isinstance(prompt, str):
        if not path or _import_transformers() is None:
            return None
        return list(load_tokenizer(path).encode(prompt, add_special_tokens=False))
    if not isinstance(prompt, list):
        raise GenerateError(
            f"policy_serving_rollout.generate: sample.prompt is a {type(prompt).__name__}; it must "
            "be a list of chat messages or a string already rendered with the chat template"
        )
    if not path:
        raise GenerateError(
            "policy_serving_rollout.generate: args.hf_checkpoint (--hf-checkpoint) is not set; it "
            "names the policy's tokenizer, whose chat template renders the prompt"
        )
    tok = load_tokenizer(path)
    text = tok.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True, **_template_kwargs(args, sample)
    )
    return list(tok.encode(text, add_special_tokens=False))


def generate_url(args: Any) -> str:
    """SGLang's ``/generate`` behind Slime's router (``--sglang-router-ip`` / ``-port``)."""
    ip = getattr(args, "sglang_router_ip", None)
    port = getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise GenerateError(
            "policy_serving_rollout.generate: args.sglang_router_ip and args.sglang_router_port "
            "(set by Slime, or --sglang-router-ip / --sglang-router-port) name the policy's "
            f"SGLang router; got {ip!r}:{port!r}"
        )
    return f"http://{ip}:{port}/generate"


def _post(url: str, payload: Dict[str, Any], timeout: Optional[float]) -> Dict[str, Any]:
    body = json.dumps(payload).encode("utf-8")
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        text = (e.read() if e.fp is not None else b"").decode("utf-8", "replace").strip()
        raise GenerateError(f"POST {url} -> HTTP {e.code}: {text[:500] or '(empty body)'}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise GenerateError(
            f"POST {url}: cannot reach the policy's SGLang ({reason}); check "
            "--sglang-router-ip / --sglang-router-port"
        ) from None
    try:
        out = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise GenerateError(f"POST {url}: the answer is not JSON: {e}") from None
    if isinstance(out, list) and len(out) == 1:
        out = out[0]
    if not isinstance(out, dict) or not isinstance(out.get("meta_info"), dict):
        raise GenerateError(f"POST {url}: the answer has no meta_info object: {str(out)[:300]}")
    return out


def _pairs(url: str, meta: Dict[str, Any], key: str) -> List[Tuple[Optional[float], int]]:
    rows = meta.get(key)
    if not isinstance(rows, list):
        raise GenerateError(
            f"POST {url}: meta_info.{key} is missing although return_logprob was sent "
            "(is this SGLang's native /generate?)"
        )
    out: List[Tuple[Optional[float], int]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) < 2 or not isinstance(row[1], int):
            raise GenerateError(f"POST {url}: meta_info.{key}[{i}] is not [logprob, token_id, ...]: {row!r}")
        lp = row[0]
        out.append((None if lp is None else float(lp), int(row[1])))
    return out


def _status(sample: Any, value: str) -> Any:
    enum = getattr(type(sample), "Status", None)
    if enum is None:
        cls = slime_sample_class()
        enum = getattr(cls, "Status", None) if cls is not None else None
    return enum(value) if enum is not None else value


def finish_status(meta: Dict[str, Any]) -> str:
    """Slime's status for SGLang's ``finish_reason``: length → truncated, abort → aborted."""
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "length":
        return "truncated"
    if kind == "abort":
        return "aborted"
    return "completed"


def generate_sync(
    args: Any, sample: Any, sampling_params: Dict[str, Any], evaluation: bool = False
) -> Any:
    """:func:`generate` without the event loop (one blocking HTTP call)."""
    ids = prompt_ids(args, sample)
    url = generate_url(args)
    payload: Dict[str, Any] = {
        "sampling_params": dict(sampling_params or {}),
        "return_logprob": True,
    }
    if ids is None:
        # A rendered string without a local tokenizer: SGLang tokenizes it and reports the ids
        # it used as the input log-prob entries.
        payload["text"] = sample.prompt
        payload["logprob_start_len"] = 0
    else:
        payload["input_ids"] = ids
    out = _post(url, payload, getattr(args, "policy_serving_generate_timeout_sec", None))
    meta = out["meta_info"]
    if ids is None:
        ids = [tok for _, tok in _pairs(url, meta, "input_token_logprobs")]
    output = _pairs(url, meta, "output_token_logprobs")
    out_ids = out.get("output_ids")
    if isinstance(out_ids, list) and out_ids and out_ids != [tok for _, tok in output]:
        raise GenerateError(
            f"POST {url}: meta_info.output_token_logprobs names other tokens than output_ids"
        )
    missing = [i for i, (lp, _) in enumerate(output) if lp is None]
    if missing:
        raise GenerateError(
            f"POST {url}: no log-prob for output token(s) at {missing[:10]}: a sample needs one "
            "per response token"
        )
    sample.tokens = list(ids) + [tok for _, tok in output]
    sample.response = out.get("text") or ""
    sample.response_length = len(output)
    sample.rollout_log_probs = [float(lp) for lp, _ in output]  # type: ignore[arg-type]
    sample.loss_mask = [1] * len(output)
    sample.status = _status(sample, finish_status(meta))
    version = meta.get("weight_version")
    if version is not None:
        sample.weight_versions = list(getattr(sample, "weight_versions", None) or []) + [version]
    return sample


async def generate(
    args: Any, sample: Any, sampling_params: Dict[str, Any], evaluation: bool = False
) -> Any:
    """Slime's ``--custom-generate-function-path``: one SGLang ``/generate`` call for ``sample``.

    Renders ``sample.prompt`` (:func:`prompt_ids`), posts it to
    ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`` with the sampling
    params and ``return_logprob: true``, and fills ``tokens`` (prompt ids + output ids),
    ``response``, ``response_length``, ``rollout_log_probs`` (one per output token),
    ``loss_mask`` (all ones), ``status`` (``truncated`` when SGLang stopped on the length limit,
    ``aborted`` when it aborted, else ``completed``) and appends ``meta_info.weight_version`` to
    ``weight_versions``. Optional ``args.policy_serving_generate_timeout_sec`` bounds the call
    (default: none, like the reference).
    """
    return await asyncio.get_running_loop().run_in_executor(
        None, generate_sync, args, sample, sampling_params, evaluation
    )


def _score(sample: Any) -> float:
    global _warned_no_reward
    reward = sample.get("reward") if isinstance(sample, dict) else getattr(sample, "reward", None)
    score = reward.get("score") if isinstance(reward, dict) else reward
    if score is None:
        if not _warned_no_reward:
            _warned_no_reward = True
            log.warning(
                "policy_serving_rollout.reward_func: a sample has no reward (samples Slime "
                "generates itself, e.g. for evaluation, get none from the policy-serving server); "
                "its score is 0.0, as in the reference. Give such datasets a reward function of "
                "their own (custom_rm_path in the eval dataset config)"
            )
        return 0.0
    return float(score)


def _reward_value(args: Any, sample: Any) -> Any:
    keys = [k for k in (getattr(args, "reward_key", None), getattr(args, "eval_reward_key", None)) if k]
    score = _score(sample)
    if not keys:
        return score
    return {k: score for k in keys}


async def reward_func(args: Any, sample_or_samples: Any, **kwargs: Any) -> Any:
    """Slime's ``--custom-rm-path``: the score the server put in ``sample.reward``.

    The score is ``reward["score"]`` when the reward is a dict, else the reward itself (0.0 when
    there is none, as in the reference). Slime reads the returned reward with ``--reward-key``
    (``reward[key]``), so with ``args.reward_key`` (or ``eval_reward_key``) set, the score comes
    back as ``{key: score}``, as the reference's ``{"score": ...}``; without, as the float. A
    list of samples (``--group-rm``) gives a list.
    """
    if isinstance(sample_or_samples, list):
        return [_reward_value(args, s) for s in sample_or_samples]
    return _reward_value(args, sample_or_samples)
