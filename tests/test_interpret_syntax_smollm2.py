"""The real decoder, SmolLM2-135M-Instruct from its GGUF file: syntax scores respect the causal
mask on real weights, and inspect's table shows its induction heads with the sinks summarised."""

import pytest

from multihead.interpret.subject import CausalLMSubject
from multihead.interpret.syntax import DIRECTIONS, read_conllu, shipped_corpus, syntax_scores


@pytest.fixture(scope="module")
def subject(smollm2):
    return CausalLMSubject(smollm2, smollm2.tokenizer.tokenizer, bos_id=smollm2.tokenizer.bos_id)


@pytest.mark.slow
def test_smollm2_syntax_scores_only_visible_pairs(subject):
    sentences = read_conllu(shipped_corpus())[::4]  # 73 sentences, every construction
    result = syntax_scores(subject, sentences, name="SmolLM2", min_count=10, batch_size=24)
    assert result.causal and result.shape == (30, 9) and not result.skipped
    arcs = sum(1 for s in sentences for r in s.relations if r not in ("punct", "root"))
    for direction in DIRECTIONS:
        assert result.scored_pairs[direction] + result.dropped[direction] == arcs
    rows = {(r.relation, r.direction): r for r in result.rows}
    # determiners precede their nouns: head->dependent only; subjects precede their verbs
    assert ("det", "head->dependent") in rows and ("det", "dependent->head") not in rows
    det = rows["det", "head->dependent"]
    assert det.baseline_offset == -1 and det.accuracy >= det.baseline_accuracy
    # the real weights find objects' verbs (to their left) above the best fixed offset
    obj = rows["obj", "dependent->head"]
    assert obj.accuracy > obj.baseline_accuracy


@pytest.mark.slow
def test_smollm2_inspect_table_shows_induction_heads_and_summarises_sinks(subject):
    from multihead.interpret.analysis import analyze
    from multihead.interpret.roles import role_table, sinks_that_induct

    analysis = analyze(
        subject, ["The quick brown fox jumps over the lazy dog, and the dog sleeps."]
    )
    probe = role_table(analysis.roles, "probe")
    assert [(r.layer, r.head) for r in probe.per_kind if r.role == "induction"] == [(18, 6)]
    text = role_table(analysis.roles, "text")
    assert len(text.sinks) > 50 and all(r.role != "special-token sink" for r in text.per_kind)
    assert (18, 6) in sinks_that_induct(analysis.roles)
