"""evalkit's one exception hierarchy; every class fixes the exit code the CLI returns for it.

    EvalkitError                      exit 1
    ├── UsageError                    exit 2   a bad argument or option
    │   └── UnknownDomainError        exit 2   names the valid domains
    ├── DataError                     exit 3   a domain directory or task file that cannot be used
    │   └── WrongDataError            exit 6   a results file run on other data than the loaded
    │                                          domain's (its tasks or database ids are not there)
    ├── ResultsFileError              exit 4   a results file that is missing, truncated or corrupt
    └── EpisodeError                  exit 5   an episode could not be run at all
        ├── AgentError                         the agent broke the protocol (empty message, …)
        ├── UserSimulatorError                 the user simulator broke the protocol
        └── EndpointError                      an OpenAI-compatible endpoint failed
            └── JudgeError                     the NL judge failed or answered nothing readable,
                                               after its retries

The CLI prints `message` (never a traceback) and exits with `exit_code`. Inside an episode,
`AgentError`, `UserSimulatorError` and `EndpointError` end the episode with the termination
reasons `agent_error`, `user_error` and `infrastructure_error` instead of escaping.
"""

from __future__ import annotations

from typing import ClassVar


class EvalkitError(Exception):
    """Root of every error evalkit raises on purpose."""

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(EvalkitError):
    exit_code = 2


class UnknownDomainError(UsageError):
    """A domain name that is not registered; the message lists the valid names."""


class DataError(EvalkitError):
    exit_code = 3


class WrongDataError(DataError):
    """A results file whose tasks or database ids are not in the loaded domain data: any verdict
    would come from the wrong data, so commands refuse it (`evalkit.exits.WRONG_DATA`)."""

    exit_code = 6


class ResultsFileError(EvalkitError):
    """A results file that cannot be read: the message names the file and the position."""

    exit_code = 4


class EpisodeError(EvalkitError):
    exit_code = 5


class AgentError(EpisodeError):
    """The agent produced something the episode cannot continue with."""


class UserSimulatorError(EpisodeError):
    """The user simulator produced something the episode cannot continue with."""


class EndpointError(EpisodeError):
    """An OpenAI-compatible endpoint (agent, user or judge) failed after the client's retries.

    `error_type` is the `error.type` of the endpoint's JSON body when it sent one (the proxy's
    `error_budget_exhausted`, for instance).
    """

    def __init__(
        self, message: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class JudgeError(EndpointError):
    """The NL-assertion judge failed on every attempt (the last reason in the message): the
    episode is an infrastructure error, never scored as if its assertions held."""
