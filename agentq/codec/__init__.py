"""The versioned, pickle-free msgpack codec for checkpoints and stored values."""

from agentq.codec.envelope import (
    FORMAT_VERSION,
    EncodedCheckpoint,
    build_checkpoint,
    check_shape,
    decode_checkpoint,
    decode_envelope,
    decode_value,
    encode_checkpoint,
    encode_value,
)
from agentq.codec.unstorable import unserializable

__all__ = [
    "FORMAT_VERSION",
    "EncodedCheckpoint",
    "build_checkpoint",
    "check_shape",
    "decode_checkpoint",
    "decode_envelope",
    "decode_value",
    "encode_checkpoint",
    "encode_value",
    "unserializable",
]
