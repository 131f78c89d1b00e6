"""Thread ids and effect keys: a character that could forge a log line is refused by code
point; printable Unicode is not."""

from __future__ import annotations

import pytest

from agentq.errors import InvalidEffectKey, InvalidThreadId
from agentq.ids import validate_effect_key, validate_thread_id

# C1 controls (U+009B introduces a terminal escape, as ESC [ does), NEL, and the Unicode
# line and paragraph separators: each can forge a log line or a terminal's output. A lone
# surrogate cannot be written as a key at all.
BAD_CHARACTERS = ["\x80", "\x85", "\x9b", "\x9f", "\u2028", "\u2029", "\x1b", "\x7f", "\ud800"]


@pytest.mark.parametrize("char", BAD_CHARACTERS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_thread_id_with_a_control_or_separator_is_refused_by_code_point(char: str) -> None:
    with pytest.raises(InvalidThreadId) as info:
        validate_thread_id(f"order-{char}[31mFAKE")
    assert f"U+{ord(char):04X}" in str(info.value) and "remove it" in str(info.value)


@pytest.mark.parametrize("char", BAD_CHARACTERS, ids=lambda c: f"U+{ord(c):04X}")
def test_an_effect_key_with_a_control_or_separator_is_refused(char: str) -> None:
    with pytest.raises(InvalidEffectKey, match=f"effect key .* U\\+{ord(char):04X}"):
        validate_effect_key(f"charge{char}", "t1")


@pytest.mark.parametrize("thread_id", ["ordre-é", "用户-42", "a b", "nbsp\xa0id", "emoji-🙂"])
def test_printable_unicode_thread_ids_are_still_accepted(thread_id: str) -> None:
    assert validate_thread_id(thread_id) == thread_id


@pytest.mark.parametrize("key", ["", "a{b}", "k" * 10_000, "charge\x1b"])
def test_a_bad_effect_key_names_its_thread(key: str) -> None:
    """The thread id is valid and says whose call it is (agentq resolve t1 'a{b}')."""
    with pytest.raises(InvalidEffectKey) as info:
        validate_effect_key(key, "t1")
    assert info.value.thread_id == "t1" and str(info.value).startswith("thread 't1'")
