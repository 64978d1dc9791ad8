"""benchmarks/rl_step.py's pure parts: the prompt fitted to a token budget, the reward, the order of the
sides, the per-side summary and the ours/TRL ratios (no timing is asserted)."""

from __future__ import annotations


def words(messages) -> int:
    """A stand-in tokenizer: one token a word, plus 10 for the chat template."""
    return sum(len(m["content"].split()) for m in messages) + 10


def test_the_prompt_is_the_longest_that_fits_the_token_budget(bench):
    base = words(bench.prompt_messages(0))
    messages, n = bench.fit_prompt(words, 256)
    assert n == words(messages) == 256 and messages == bench.prompt_messages(256 - base)
    assert bench.fit_prompt(words, base - 1)[1] == base  # shorter than the fixed part: the fixed part alone


def test_the_reward_differs_between_completions(bench):
    assert bench.completion_reward("aaaa") == 1.0 and bench.completion_reward("abca") == 3.0


def test_each_side_goes_first_as_often_as_the_other(bench):
    assert bench.run_order(1) == ["ours", "trl", "before", "fast", "ours_f32"]
    assert bench.run_order(2) == ["ours", "trl", "before", "fast", "ours_f32",
                                  "ours_f32", "fast", "before", "trl", "ours"]
    assert bench.run_order(3, ("ours", "trl")) == ["ours", "trl", "trl", "ours", "ours", "trl"]


def run(step, generate, peak, load=900.0):
    return {"steps": {"step": step, "generate": generate, "update": [s - g for s, g in zip(step, generate)]},
            "peak_rss_mib": peak, "rss_after_load_mib": load}


def test_rounds_are_pooled_and_the_ratios_are_ours_over_trl(bench):
    ours = bench.side_summary([run([10.0, 12.0], [4.0, 5.0], 1500.0), run([11.0], [4.0], 1600.0)])
    trl = bench.side_summary([run([20.0, 22.0, 21.0], [8.0, 8.0, 9.0], 2000.0)])
    assert ours["seconds_per_step"]["median"] == 11.0 and ours["seconds_per_step"]["all"] == [10.0, 12.0, 11.0]
    assert ours["update_seconds"]["median"] == 7.0 and ours["peak_rss_mib"] == 1600.0
    assert bench.ratios(ours, trl) == {"seconds_per_step": 0.524, "generate_seconds": 0.5,
                                       "update_seconds": 0.583, "peak_rss": 0.8}  # 7 / 12
