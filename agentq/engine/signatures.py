"""What is wrong with arguments that do not fit a function: said for a person."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any


def misfit(signature: inspect.Signature, keywords: Mapping[str, Any], exc: TypeError) -> str:
    """Why ``keywords`` (with whatever came positionally) did not bind to ``signature``,
    as ``bind`` raised ``exc``: a misspelt name is the likelier mistake, so it is named
    before the argument it leaves missing."""
    params = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [] if takes_any else [name for name in keywords if name not in params]
    return f"unexpected keyword argument(s) {unknown}" if unknown else str(exc)
