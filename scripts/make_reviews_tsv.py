#!/usr/bin/env python3
"""Write small movie-review-shaped TSV files for examples/text_classifier.est.

Not IMDB (which cannot be downloaded here): short lowercase reviews drawn with Python's
`random` from a fixed seed, built from a few hundred words of film vocabulary, with
positive and negative opinion words, negations ("not good" counts as negative) and
intensifiers, of 4 to 24 words. A review's label is 1 when its opinions add up to
positive, and a few labels (5%) are flipped, as real ratings disagree with their text.

Usage:
    python3 scripts/make_reviews_tsv.py [OUT_DIR]

OUT_DIR defaults to examples/data. Writes reviews_train.tsv (1200 reviews) and
reviews_test.tsv (300), each with the header `label<TAB>review`. The output is
deterministic.
"""

import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
POSITIVE = ["great", "wonderful", "brilliant", "moving", "funny", "superb", "charming",
            "delightful", "gripping", "beautiful", "clever", "fresh", "good", "lovely"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "clumsy", "tedious", "bland",
            "dreadful", "messy", "silly", "weak", "bad", "lifeless", "predictable"]
SUBJECTS = ["the movie", "the film", "the plot", "the acting", "the story", "the cast",
            "the ending", "the script", "the direction", "the music", "the dialogue",
            "the lead", "this sequel", "the camera work", "the pacing", "the villain"]
VERBS = ["was", "is", "felt", "seemed", "looked", "sounded"]
INTENSIFIERS = ["", "", "", "very ", "really ", "quite ", "truly ", "rather "]
FILLER = ["i saw it on a sunday", "my friends came along", "it runs two hours",
          "the cinema was full", "i had read the book", "it opened last week",
          "we watched it at home", "the trailer said little"]


def clause(rng):
    """A clause and its opinion: +1 or -1."""
    positive = rng.random() < 0.5
    negated = rng.random() < 0.2
    word = rng.choice(POSITIVE if positive != negated else NEGATIVE)
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {'not ' if negated else ''}{rng.choice(INTENSIFIERS)}{word}"
    return text, 1 if positive else -1


def review(rng):
    parts, score = [], 0
    for _ in range(rng.randint(1, 3)):
        text, s = clause(rng)
        parts.append(text)
        score += s
    if rng.random() < 0.4:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(FILLER))
    if score == 0:
        text, s = clause(rng)
        parts.append(text)
        score += s
    label = 1 if score > 0 else 0
    if rng.random() < 0.05:
        label = 1 - label
    return label, " and ".join(parts)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "examples" / "data"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(13)
    for name, count in [("reviews_train.tsv", 1200), ("reviews_test.tsv", 300)]:
        rows = [review(rng) for _ in range(count)]
        with open(out / name, "w", newline="\n") as f:
            f.write("label\treview\n")
            for label, text in rows:
                f.write(f"{label}\t{text}\n")
        print(f"{out / name}: {count} reviews")


if __name__ == "__main__":
    main()
