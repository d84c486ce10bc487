"""The simulated quantized upstream: an OpenAI-compatible server that plays the agent of a task
and errs by a damage profile, so replays run on a laptop with no model at hand.

It is a model of failure dynamics for demos, tests and load, not of any real model; every answer
it gives says so (`model: sim-<profile>`, `system_fingerprint: evalkit-sim-<profile>`).
"""

from evalkit.sim.model import EpisodeKey, SimReply, SimulatedModel, UnknownTaskError
from evalkit.sim.profiles import DamageProfile, builtin_profiles, load_profile
from evalkit.sim.server import create_sim_app

__all__ = [
    "DamageProfile",
    "EpisodeKey",
    "SimReply",
    "SimulatedModel",
    "UnknownTaskError",
    "builtin_profiles",
    "create_sim_app",
    "load_profile",
]
