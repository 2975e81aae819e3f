"""Errors of an offload policy: a value the caller gave that the policy cannot take.

Each carries one line naming the key and the problem. How it is reported is the caller's choice
(the command line prints the line and exits 2: `engine.errors.OPERATOR_ERRORS`).
"""


class PolicyError(ValueError):
    """An invalid `dlo_offload_components` / resident-layers / mode combination."""


class PolicyTypeError(PolicyError, TypeError):
    """A policy value of the wrong type (vLLM-Omni raises TypeError for these)."""
