"""THE model package: every subcommand builds, loads and runs the Transformer from here."""

from tfm_cli.model.attention import (
    CrossAttention,
    KeyValueCache,
    SelfAttention,
    SelfAttentionCache,
)
from tfm_cli.model.transformer import (
    Decoded,
    DecoderState,
    Encoded,
    StepOutput,
    Transformer,
    count_parameters,
    parameter_shapes,
)

__all__ = [
    "CrossAttention",
    "Decoded",
    "DecoderState",
    "Encoded",
    "KeyValueCache",
    "SelfAttention",
    "SelfAttentionCache",
    "StepOutput",
    "Transformer",
    "count_parameters",
    "parameter_shapes",
]
