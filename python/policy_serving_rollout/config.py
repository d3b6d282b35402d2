"""The bridge's keys of the operators' trainer-side ``config.toml``.

One file configures both sides: ``policy-serving serve --config config.toml`` reads the keys that
concern the server, the bridge reads its own, and the trainer keeps the rest. :data:`CONFIG_KEYS`
is the one list of every key of that file and of the side that reads it; a key in none of them is
an error that names it (python/README.md shows the same table).

The file is found through ``args.policy_serving_config`` or env ``POLICY_SERVING_CONFIG``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

CONFIG_ENV = "POLICY_SERVING_CONFIG"
CONFIG_ARG = "policy_serving_config"

BRIDGE = "bridge"
SERVER = "server"
TRAINER = "trainer"

# Every key of the operators' config.toml: which sides read it, and what for. Keep this the only
# list; README.md's table is written from it.
CONFIG_KEYS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "rollout.mode": (
        (BRIDGE,),
        'checked against the server\'s mode (`GET /v1/rollout/status`): `"openclaw"` (the '
        "reference's value) accepts any server mode, or, with `opd.enabled`, `opd`/`combine` "
        "when true and `rl` when false; `rl`, `opd`, `combine` must equal the server's",
    ),
    "rollout.api_server_url": (
        (SERVER, BRIDGE),
        "server: the listen address; bridge: the server URL (after `args.policy_serving_url` "
        "and env `POLICY_SERVING_URL`)",
    ),
    "rollout.output_queue_size": (
        (BRIDGE,),
        "bound on the samples the bridge holds pulled beyond a batch (its carry-over)",
    ),
    "rollout.sample_timeout_sec": (
        (SERVER,),
        "server: `server.session_timeout_sec` (see the server's table); the bridge checks it but "
        "waits for a batch as long as it takes, like the reference (only "
        "`args.policy_serving_timeout_sec` bounds that wait)",
    ),
    "policy.model_name": ((SERVER,), "the policy model"),
    "policy.served_model_name": ((SERVER,), "the model name the proxy serves"),
    "policy.tp_size": ((TRAINER,), "the trainer's tensor parallelism"),
    "reward.prm_enabled": ((SERVER,), "PRM scoring on or off"),
    "reward.prm_num_votes": ((SERVER,), "PRM votes per turn"),
    "opd.enabled": (
        (BRIDGE,),
        "with `rollout.mode = \"openclaw\"`: which server modes the bridge accepts",
    ),
    "opd.teacher_base_url": ((SERVER,), "the teacher's provider root"),
    "opd.teacher_api_key_env": ((SERVER,), "name of the variable holding the teacher's key"),
    "opd.teacher_model": ((SERVER,), "the teacher model"),
    "opd.top_k": ((SERVER,), "K of top-K distillation (0: off)"),
}

# Tables the trainer itself reads whole: their keys are the trainer's, never an error here.
TRAINER_TABLES: Dict[str, str] = {"training": "the trainer's own settings"}

MODES = ("openclaw", "rl", "opd", "combine")


class ConfigError(ValueError):
    """The operators' config.toml cannot be used; the message names the file and the key."""


@dataclass
class OperatorConfig:
    """The bridge's view of config.toml (``None``: the key is not in the file)."""

    path: Path
    mode: Optional[str] = None
    api_server_url: Optional[str] = None
    output_queue_size: Optional[int] = None
    sample_timeout_sec: Optional[float] = None
    opd_enabled: Optional[bool] = None

    def expected_modes(self) -> Optional[Tuple[str, ...]]:
        """The server modes this file accepts (``None``: any)."""
        if self.mode is None:
            return None
        if self.mode == "openclaw":
            if self.opd_enabled is None:
                return None
            return ("opd", "combine") if self.opd_enabled else ("rl",)
        return (self.mode,)

    def check_server_mode(self, server_mode: Optional[str], url: str) -> None:
        """Raise :class:`ConfigError` when the server at ``url`` runs a mode this file rules out."""
        want = self.expected_modes()
        if want is None or server_mode is None or server_mode in want:
            return
        why = f"rollout.mode = {self.mode!r}"
        if self.mode == "openclaw":
            why += f" with opd.enabled = {str(self.opd_enabled).lower()}"
        raise ConfigError(
            f"{self.path}: {why} expects a policy-serving server in mode "
            f"{' or '.join(repr(m) for m in want)}, but {url} runs mode {server_mode!r} "
            "(its server.mode): fix rollout.mode (or opd.enabled) here, or the server's mode"
        )


def sides(key: str) -> Tuple[str, ...]:
    """Which sides read ``key`` (dotted, e.g. ``rollout.mode``); ``()`` for an unknown key."""
    if key in CONFIG_KEYS:
        return CONFIG_KEYS[key][0]
    if key.split(".", 1)[0] in TRAINER_TABLES:
        return (TRAINER,)
    return ()


def config_path(args: Any) -> Optional[Tuple[Path, str]]:
    """The config.toml to read and where its name came from, or ``None``."""
    arg = getattr(args, CONFIG_ARG, None)
    if arg:
        return Path(arg), f"args.{CONFIG_ARG}"
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env), f"env {CONFIG_ENV}"
    return None


def _toml_loads(text: str) -> Dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]  # Python 3.11+
    except ImportError:  # pragma: no cover - depends on the Python version
        try:
            import tomli as tomllib  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise ConfigError(
                "reading config.toml needs Python 3.11+ (tomllib) or the 'tomli' package "
                "(pip install tomli)"
            ) from None
    return tomllib.loads(text)


def _flatten(doc: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """``{"table.key": value}`` of the file, and the problems with its shape."""
    flat: Dict[str, Any] = {}
    problems: List[str] = []
    for table, body in doc.items():
        if table in TRAINER_TABLES:
            continue
        if not isinstance(body, dict):
            problems.append(f"{table} (a value outside any table)")
            continue
        for key, value in body.items():
            flat[f"{table}.{key}"] = value
    return flat, problems


def parse(text: str, path: Path) -> OperatorConfig:
    """Check every key of ``text`` (the file at ``path``) and read the bridge's."""
    try:
        doc = _toml_loads(text)
    except ConfigError:
        raise
    except ValueError as e:  # tomllib.TOMLDecodeError
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    flat, problems = _flatten(doc)
    unknown = problems + sorted(k for k in flat if not sides(k))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: neither "
            "the rollout bridge nor the policy-serving server (nor the trainer) reads "
            f"{'them' if len(unknown) > 1 else 'it'}. Known keys: {', '.join(CONFIG_KEYS)}, "
            f"and any key of [{'], ['.join(TRAINER_TABLES)}]"
        )
    cfg = OperatorConfig(path=path)
    mode = flat.get("rollout.mode")
    if mode is not None:
        if not isinstance(mode, str) or mode not in MODES:
            raise ConfigError(
                f"{path}: rollout.mode = {mode!r}: must be one of {', '.join(map(repr, MODES))}"
            )
        cfg.mode = mode
    url = flat.get("rollout.api_server_url")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{path}: rollout.api_server_url = {url!r}: must be an http:// or https:// URL "
                "(e.g. \"http://127.0.0.1:30000\")"
            )
        cfg.api_server_url = url.rstrip("/")
    size = flat.get("rollout.output_queue_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"{path}: rollout.output_queue_size = {size!r}: must be a whole number of samples, "
                "at least 1"
            )
        cfg.output_queue_size = size
    timeout = flat.get("rollout.sample_timeout_sec")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(
                f"{path}: rollout.sample_timeout_sec = {timeout!r}: must be a number of seconds "
                "above 0"
            )
        cfg.sample_timeout_sec = float(timeout)
    enabled = flat.get("opd.enabled")
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise ConfigError(f"{path}: opd.enabled = {enabled!r}: must be true or false")
        cfg.opd_enabled = enabled
    return cfg


def load(path: Path, source: str = "") -> OperatorConfig:
    """Read and check the config.toml at ``path`` (``source``: where its name came from)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        where = f" (from {source})" if source else ""
        raise ConfigError(f"cannot read the operators' config.toml {path}{where}: {e}") from None
    return parse(text, path)


def load_for(args: Any) -> Optional[OperatorConfig]:
    """The config.toml named by ``args.policy_serving_config`` / env, or ``None`` when none is."""
    found = config_path(args)
    if found is None:
        return None
    return load(*found)
