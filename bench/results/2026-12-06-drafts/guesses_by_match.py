"""guesses_by_match.py ANSWERS.json: at every position of each saved answer, the latest earlier run of its longest
ending (2 to 8 tokens) guesses the next 5; how many of them the answer took, by the run's length."""
import collections
import json
import sys

LONGEST = 8
stats: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # guesses, tokens taken, first taken
with open(sys.argv[1]) as f:
    answers = json.load(f)
for item in answers:
    prompt, answer = item["prompt"], item["answer"]
    for i in range(len(answer)):
        tokens = prompt + answer[:i]
        n = len(tokens)
        for size in range(min(LONGEST, n - 1), 1, -1):
            at = next((end for end in range(n - 1, size - 1, -1) if tokens[end - size:end] == tokens[n - size:]),
                      None)
            if at is None:
                continue
            guess, taken = tokens[at:at + 5], 0
            while taken < len(guess) and i + taken < len(answer) and guess[taken] == answer[i + taken]:
                taken += 1
            row = stats[size]
            row[0] += 1
            row[1] += taken
            row[2] += taken > 0
            break
for size in sorted(stats):
    guesses, taken, first = stats[size]
    print(f"run of {size}: {guesses} guesses, {taken / guesses:.2f} of 5 taken, the first taken {first / guesses:.0%}")
