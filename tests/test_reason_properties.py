"""The one reason validator, held as a property over generated text (issue 57): every reason one channel accepts
(REST's body field, the chat's "because …", a Slack / Feishu button's typed reason, the CLI, the store itself) every
other accepts, storing the same text; every one it refuses, every other refuses in the same words; and no text that
renders blank (white space, format characters, fillers, keycaps, punctuation, emoji, lone marks) is accepted."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from api.chat_intent import Intent, with_reason
from api.chatops.common import Refused, button_reason
from api.schemas import Reason
from core.errors import FieldError
from state.reasons import MAX_REASON, check_reason, reason_problem

REST = TypeAdapter(Reason)
# drawn as nothing or as a symbol, never as a word: spaces and line breaks of every kind, format characters
# (zero-width space / joiners, BOM, soft hyphen, bidi marks, Mongolian vowel separator), the Hangul fillers, the
# braille blank, keycap and enclosing marks, variation selectors, combining accents alone, punctuation, emoji
BLANK = (" \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2001\u2007\u200a\u2028\u2029\u202f\u205f\u3000"
         "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u202a\u202e\u180e"
         "\u115f\u1160\u3164\uffa0\u2800\u20e3\u20dd\u20de\ufe0f\ufe0e\u0301\u0300\u0308"
         ".,;:!?-—…。、「」()[]{}<>*_~`'\"#@$%^&+=|/\\"
         "👍👎🙅♀🎉🔥❤️✅❌⭐☃️🇺🇸")
KEYCAPS = [f"{d}\ufe0f\u20e3" for d in "0123456789#*"] + [f"{d}\u20e3" for d in "0123456789"] + ["a\u20dd", "Z\u20de"]
WORDS = ["a", "Z", "é", "ß", "字", "批", "ㅎ", "한", "٣", "१", "Ω", "я", "5", "²", "Ⅻ", "𝐀", "ｘ"]


def _channels(text: str) -> dict[str, tuple[bool, str]]:
    """Each channel's verdict on `text`: (accepted, the text stored) or (refused, its message)."""
    out: dict[str, tuple[bool, str]] = {}
    try:
        out["rest"] = (True, REST.validate_python(text))
    except ValidationError as e:
        out["rest"] = (False, e.errors()[0]["msg"])
    said = with_reason(Intent(kind="reject", candidate_id=1), text)
    out["chat"] = (said.kind == "reject", said.reason or "")
    try:
        out["slack/feishu"] = (True, button_reason("reject", text) or "")
    except Refused as e:
        out["slack/feishu"] = (False, str(e))
    why = reason_problem(text)  # the CLI's own check of --reason, then the store's
    out["cli"] = (False, why) if why is not None else (True, check_reason(text) or "")
    try:
        out["store"] = (True, check_reason(text) or "")
    except FieldError as e:
        out["store"] = (False, str(e))
    return out


def _agree(text: str) -> tuple[bool, str]:
    got = _channels(text)
    accepted = {ok for ok, _ in got.values()}
    assert len(accepted) == 1, (text, got)
    if accepted == {True}:
        stored = {said for _, said in got.values()}
        assert len(stored) == 1, (text, got)
        return True, stored.pop()
    why = (reason_problem(text) or "").removeprefix("reason: ")
    assert why and all(why in said for _, said in got.values()), (text, got)  # one message everywhere
    return False, why


_pieces = st.one_of(st.text(max_size=12), st.text(alphabet=BLANK, max_size=12), st.sampled_from(KEYCAPS),
                    st.sampled_from(WORDS))
REASONS = st.one_of(
    st.lists(_pieces, max_size=8).map("".join),
    st.builds(lambda a, n, b: a + " " * n + b, _pieces, st.integers(0, 2 * MAX_REASON), _pieces),  # folded to fit
    st.builds(lambda c, n, pad: c * n + pad, st.sampled_from(WORDS), st.integers(MAX_REASON - 3, MAX_REASON + 3),
              st.text(alphabet=" \n\u3000", max_size=600)),  # at the limit, after folding
)
BLANKS = st.lists(st.one_of(st.text(alphabet=BLANK, max_size=20), st.sampled_from(KEYCAPS)), max_size=10).map("".join)
FAST = settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(REASONS)
def test_every_channel_accepts_the_same_reasons_and_stores_the_same_text(text):
    ok, said = _agree(text)
    if ok:
        assert said == " ".join(text.split()) and len(said) <= MAX_REASON and said.strip() == said


@FAST
@given(BLANKS)
def test_no_reason_that_renders_blank_is_accepted_anywhere(text):
    ok, _ = _agree(text)
    assert not ok, repr(text)


def test_the_examples_of_the_issue():
    for blank in ("\u3164", "1️⃣0️⃣", "\u3164\u3164 ", "#️⃣ *️⃣", "\u200b", "\u2800"):
        assert _agree(blank)[0] is False, repr(blank)
    assert _agree("a" + " " * 600 + "b") == (True, "a b")
    assert _agree("x" * (MAX_REASON + 1))[0] is False
    assert _agree("批准 ok")[0] is True and _agree("nul\x00here")[0] is False
