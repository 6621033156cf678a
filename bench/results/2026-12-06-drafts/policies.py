"""policies.py ANSWERS.json COSTS: each answer replayed with engine/drafting.py's guesses under a few rules for a
guess's length, a step costing COSTS[rows - 1] (a step of one row = 1; blocks_cost.py's figures): the speed-up over
a token a step, by kind of question. Run from the repository root with PYTHONPATH=backend."""
import json
import sys

import typewriter.engine.drafting as drafting

with open(sys.argv[1]) as f:
    answers = json.load(f)
costs = [float(c) for c in sys.argv[2].split(",")]


def replay(rule) -> dict:
    totals: dict[str, list[float]] = {}
    for item in answers:
        prompt, answer = item["prompt"], item["answer"]
        guesses, at, seconds = drafting.Drafts(5), 0, 0.0
        while at < len(answer):
            guess = guesses.propose(prompt, answer[:at], min(5, len(answer) - at - 1))
            taken = 0
            while taken < len(guess) and guess[taken] == answer[at + taken]:
                taken += 1
            if guess:
                rule(guesses, len(guess), taken)
            seconds += costs[len(guess)]
            at += taken + 1
        total = totals.setdefault(item["kind"], [0, 0.0])
        total[0] += len(answer)
        total[1] += seconds
    return {kind: round(n / s, 3) for kind, (n, s) in totals.items()}


def engine_s(guesses, drafted, taken):  # grows by one when taken whole, halves when refused whole
    guesses.checked(drafted, taken)


def follow_the_last(guesses, drafted, taken):  # the last guess's taken tokens and one more
    guesses.checked(drafted, taken)
    guesses.length = max(1, min(guesses.most, taken + 1))


def always_five(guesses, drafted, taken):
    guesses.checked(drafted, taken)
    guesses.length = guesses.most


for name, rule in (("engine's", engine_s), ("follow the last", follow_the_last), ("always 5", always_five)):
    print(f"{name:16s}", replay(rule))
for longest in (6, 8, 12):
    drafting.LONGEST_MATCH = longest
    print(f"matches up to {longest:2d}", replay(engine_s))
