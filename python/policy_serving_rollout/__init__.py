"""Client and Slime rollout bridge for the policy-serving rollout API (docs/rollout-api.md)."""

from .client import RolloutAPIError, RolloutClient, RolloutConnectionError, RolloutError
from .config import ConfigError
from .convert import sample_to_slime, to_slime_groups
from .slime_hooks import GenerateError, generate, reward_func
from .slime_rollout import (
    RolloutBridge,
    RolloutOutput,
    eval_rollout,
    generate_rollout,
    get_bridge,
    reset_bridges,
)

__all__ = [
    "ConfigError",
    "GenerateError",
    "RolloutAPIError",
    "RolloutBridge",
    "RolloutClient",
    "RolloutConnectionError",
    "RolloutError",
    "RolloutOutput",
    "eval_rollout",
    "generate",
    "generate_rollout",
    "get_bridge",
    "reset_bridges",
    "reward_func",
    "sample_to_slime",
    "to_slime_groups",
]
