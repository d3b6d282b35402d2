"""Client and Slime rollout bridge for the policy-serving rollout API (docs/rollout-api.md)."""

from .client import RolloutAPIError, RolloutClient, RolloutConnectionError, RolloutError
from .config import ConfigError
from .convert import sample_to_slime, to_slime_groups
from .slime_rollout import (
    RolloutBridge,
    RolloutOutput,
    generate_rollout,
    get_bridge,
    reset_bridges,
)

__all__ = [
    "ConfigError",
    "RolloutAPIError",
    "RolloutBridge",
    "RolloutClient",
    "RolloutConnectionError",
    "RolloutError",
    "RolloutOutput",
    "generate_rollout",
    "get_bridge",
    "reset_bridges",
    "sample_to_slime",
    "to_slime_groups",
]
