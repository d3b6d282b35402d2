"""Conversion of rollout-API samples to Slime's ``Sample`` (or plain dicts without Slime)."""

from __future__ import annotations

import copy
import importlib
import io
from typing import Any, Dict, List, Mapping, Optional

# Slime's Sample fields and their defaults (slime/utils/types.py).
SLIME_DEFAULTS: Dict[str, Any] = {
    "group_index": None,
    "index": None,
    "prompt": "",
    "tokens": [],
    "multimodal_inputs": None,
    "multimodal_train_inputs": None,
    "response": "",
    "response_length": 0,
    "label": None,
    "reward": None,
    "loss_mask": None,
    "weight_versions": [],
    "rollout_log_probs": None,
    "rollout_routed_experts": None,
    "remove_sample": False,
    "status": "pending",
    "metadata": {},
    "generate_function_path": None,
    "train_metadata": None,
    "non_generation_time": 0.0,
}

FLOAT_TENSOR_FIELDS = ("teacher_log_probs", "teacher_topk_log_probs")
LONG_TENSOR_FIELDS = ("teacher_topk_indices",)


def _import(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def slime_sample_class() -> Optional[type]:
    """Slime's ``Sample`` class when Slime is importable, else ``None``."""
    mod = _import("slime.utils.types")
    return getattr(mod, "Sample", None) if mod is not None else None


def _nan_for_none(values: Any) -> Any:
    # JSON has no NaN: a JSON export may carry null where a float was NaN.
    if isinstance(values, list):
        return [_nan_for_none(v) for v in values]
    return float("nan") if values is None else values


def _tensorize(fields: Dict[str, Any], torch: Any) -> None:
    for name in FLOAT_TENSOR_FIELDS:
        if fields.get(name) is not None:
            fields[name] = torch.tensor(_nan_for_none(fields[name]), dtype=torch.float32)
    for name in LONG_TENSOR_FIELDS:
        if fields.get(name) is not None:
            fields[name] = torch.tensor(fields[name], dtype=torch.int64)


def plain_sample(sample: Mapping[str, Any]) -> Dict[str, Any]:
    """A dict with Slime's fields (defaults filled in) plus every extra field of ``sample``."""
    out = copy.deepcopy(SLIME_DEFAULTS)
    out.update(copy.deepcopy(dict(sample)))
    return out


def multimodal_inputs(sample: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """Slime's ``multimodal_inputs`` of an API sample: ``{"images": [PIL images in prompt order]}``
    from the bytes ``RolloutClient.pull`` put in each ``images`` entry; ``None`` without images.
    ``multimodal_train_inputs`` is left to Slime's processor, as Slime does."""
    images = sample.get("images") or []
    if not images:
        return None
    pil = _import("PIL.Image")
    if pil is None:
        raise ImportError("samples with images need Pillow (pip install pillow) to build multimodal_inputs")
    out = []
    for image in images:
        if "bytes" not in image:
            raise ValueError(
                f"image {image.get('hash')} has no bytes: pull samples with RolloutClient.pull, "
                "which fetches them"
            )
        img = pil.open(io.BytesIO(image["bytes"]))
        img.load()
        out.append(img)
    return {"images": out}


def routed_experts_array(sample: Mapping[str, Any]) -> Any:
    """Slime's ``rollout_routed_experts`` of an API sample: a NumPy int32 array of shape
    ``(len(tokens) - 1, layers, top_k)`` from the bytes ``RolloutClient.pull`` joined from its
    blocks; ``None`` without routed experts."""
    experts = sample.get("rollout_routed_experts")
    if not experts:
        return None
    np = _import("numpy")
    if np is None:
        raise ImportError("samples with routed experts need NumPy (pip install numpy)")
    if "bytes" not in experts:
        raise ValueError(
            "the sample's routed experts have no bytes: pull samples with RolloutClient.pull, "
            "which fetches their blocks"
        )
    dtype = {"uint8": np.uint8, "uint16": "<u2", "int32": "<i4"}[experts["dtype"]]
    shape = tuple(int(d) for d in experts["shape"])
    arr = np.frombuffer(experts["bytes"], dtype=dtype)
    if arr.size != int(np.prod(shape)):
        raise ValueError(
            f"the sample's routed experts hold {arr.size} indices, not {shape} (a block is missing)"
        )
    return arr.reshape(shape).astype(np.int32)


def sample_to_slime(sample: Mapping[str, Any], sample_cls: Optional[type] = None) -> Any:
    """Convert one API sample (the ``"sample"`` of a pulled page entry).

    With Slime importable (or ``sample_cls`` given): a ``Sample`` whose known fields are set,
    ``status`` turned into ``Sample.Status``, and the extra fields (``session_id``, ``turn``,
    ``teacher_*``) set as attributes; teacher fields are float32 / int64 torch tensors when torch
    is installed. Without Slime: a plain dict (``plain_sample``), teacher fields left as lists.
    A sample with images gets ``multimodal_inputs`` (:func:`multimodal_inputs`); one with routed
    experts gets ``rollout_routed_experts`` as a NumPy int32 array (:func:`routed_experts_array`).
    """
    cls = sample_cls if sample_cls is not None else slime_sample_class()
    mm = multimodal_inputs(sample)
    experts = routed_experts_array(sample)
    fields = plain_sample(sample)
    if mm is not None:
        fields["multimodal_inputs"] = mm
    if experts is not None:
        fields["rollout_routed_experts"] = experts
    if cls is None:
        return fields
    torch = _import("torch")
    if torch is not None:
        _tensorize(fields, torch)
    status_enum = getattr(cls, "Status", None)
    if status_enum is not None and isinstance(fields.get("status"), str):
        try:
            fields["status"] = status_enum(fields["status"])
        except ValueError:
            pass
    obj = cls()
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


def to_slime_groups(samples: List[Mapping[str, Any]]) -> List[List[Any]]:
    """Each API sample is a group of one: ``[[Sample], [Sample], ...]``."""
    cls = slime_sample_class()
    return [[sample_to_slime(s, cls)] for s in samples]
