"""Properties of the chat grammar generated from the grammar itself (hypothesis): every command it prints parses
back to the same intent; a printed command with anything a person adds around it (a hedge, a negation, a time, a
second target, a question mark, an emoji) acts on nothing; any text at all parses without raising, and what acts
is a command the grammar prints."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.chat import ACTING, Intent, command_text, parse

WORDS = st.sampled_from(["TPOT", "is", "too", "close", "太贵", "cost", "the", "client", "limit", "p99", "42", "ms",
                         "don't", "stop", "approve", "7", "no", "因为", "budget", "round"])
REASON = st.lists(WORDS, min_size=1, max_size=8).map(" ".join).filter(lambda r: any(ch.isalnum() for ch in r))
HASH = st.text("0123456789abcdef", min_size=16, max_size=16)
RATE = st.decimals(min_value=0, max_value=999999, places=2).map(float)

INTENTS = st.one_of(
    st.builds(lambda n, h: Intent(kind="approve", candidate_id=n, card_hash=h),
              st.integers(1, 10**9 - 1), st.none() | HASH),
    st.builds(lambda n, h, r: Intent(kind="reject", candidate_id=n, card_hash=h, reason=r),
              st.integers(1, 10**9 - 1), st.none() | HASH, REASON),
    st.sampled_from([Intent(kind=k) for k in ("pause", "resume", "stop", "restore_best")]),
    st.builds(lambda n, c, r: Intent(kind="one_more_round", count=n,
                                     knobs={k: v for k, v in (("concurrency", c), ("request_rate", r)) if v is not None}),
              st.integers(1, 20), st.none() | st.integers(1, 999999), st.none() | RATE),
    st.builds(lambda h, e: Intent(kind="extend_budget", card_hours=h, experiments=e),
              st.decimals(min_value="0.01", max_value=1000000, places=2).map(float), st.none() | st.integers(0, 10000)),
    st.builds(lambda r: Intent(kind="refuse_extension", reason=r), st.none() | REASON),
)


@settings(max_examples=400, deadline=None)
@given(INTENTS)
def test_every_command_the_grammar_prints_round_trips(intent):
    text = command_text(intent)
    assert text is not None and parse(text) == intent, text


PREFIXES = ["don't", "do not", "never", "not", "maybe", "I think", "should I", "ok", "later,", "tomorrow",
            "if TTFT stays low,", "who said", "can you", "别", "不要", "明天", "🙂", "no,", "stop", "approve 8 and"]
SUFFIXES = ["?", "？", " no", " — no wait", " later", " tomorrow", " if TTFT stays low", " and 8", " and stop",
            " 👍", ", right?", " 吗", " 吗？", " or not", " maybe", " 明天", " thanks", " 8"]


@settings(max_examples=600, deadline=None)
@given(INTENTS, st.sampled_from(PREFIXES), st.sampled_from(SUFFIXES), st.integers(0, 2))
def test_a_printed_command_with_anything_around_it_acts_on_nothing(intent, prefix, suffix, where):
    text = command_text(intent)
    assert text is not None
    if where == 0:
        said = f"{prefix} {text}"
    elif intent.reason is None or suffix.rstrip().endswith(("?", "？")):  # after a reason, words are the reason
        said = text + suffix
    else:
        said = f"{prefix} {text}"
    got = parse(said)
    assert got.kind not in ACTING, (said, got)


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)
       | st.lists(WORDS | st.sampled_from(["?", ",", "pause", "批准", "轮", "C90", "more", "rounds", "extension"]),
                  max_size=8).map(" ".join))
def test_any_text_parses_without_raising_and_what_acts_is_a_printed_command(text):
    got = parse(text)
    if got.kind in ACTING and command_text(got) is not None:
        assert parse(command_text(got)) == got
    assert got.kind != "refused" or (got.reason or "").startswith("not done")
