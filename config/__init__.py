"""The one configuration tree of rankscope, and the one way to load it.

:class:`Config` composes one frozen, keyword-only dataclass per section (torchtitan's ``Config`` shape):
``stacks``, ``collectives``, ``performance`` (with its ``stragglers``), ``crashes``, ``inputs``,
``agent``, ``limits`` and ``batch``. Units are in the field names (``*_seconds``, ``*_bytes``, ``*_fraction``);
each section validates itself in ``__post_init__`` and a bad value is a :class:`~rankscope.spine.ConfigError`
naming the field, the value and what is expected.

Precedence, everywhere, highest first: **command-line flags > environment > config file > defaults**.

- Environment: ``RANKSCOPE_<SECTION>_<FIELD>`` in upper case (``RANKSCOPE_PERFORMANCE_CONTINUITY_SECONDS=120``,
  ``RANKSCOPE_PERFORMANCE_STRAGGLERS_MIN_EPISODE_STEPS=8``, ``RANKSCOPE_AGENT_STALL_SECONDS=600``).
  ``RANKSCOPE_RUN_DIR``, the hook's variable, also sets ``agent.run_dir`` (``RANKSCOPE_AGENT_RUN_DIR`` wins).
- Config file: ``--config FILE`` (or ``RANKSCOPE_CONFIG``; ``RANKSCOPE_AGENT_CONFIG`` for the agent), TOML
  (``tomllib``, or ``tomli`` on Python 3.10) or JSON (``.json``), one table per section
  (``[performance]``, ``[performance.stragglers]``, ``[agent]``, ...). The agent also accepts its
  settings at the top level of its own file. Unknown keys are errors naming the key and the valid ones.

Imports only :mod:`rankscope.spine`.
"""

from rankscope.config.agent import AgentConfig, default_pyspy
from rankscope.config.batch import RUNNERS, BatchConfig, parse_duration
from rankscope.config.loader import (
    ENV_AGENT_CONFIG,
    ENV_ALIASES,
    ENV_CONFIG,
    ENV_PREFIX,
    Config,
    agent_config_from_json,
    env_name,
    from_env,
    load_config,
    read_config_file,
    resolve_agent,
)
from rankscope.config.sections import (
    CollectivesConfig,
    CrashConfig,
    InputsConfig,
    Limits,
    PerfConfig,
    StackConfig,
    StragglerConfig,
)

__all__ = [
    "ENV_AGENT_CONFIG",
    "ENV_ALIASES",
    "ENV_CONFIG",
    "ENV_PREFIX",
    "RUNNERS",
    "AgentConfig",
    "BatchConfig",
    "CollectivesConfig",
    "Config",
    "CrashConfig",
    "InputsConfig",
    "Limits",
    "PerfConfig",
    "StackConfig",
    "StragglerConfig",
    "agent_config_from_json",
    "default_pyspy",
    "env_name",
    "from_env",
    "load_config",
    "parse_duration",
    "read_config_file",
    "resolve_agent",
]
