#!/usr/bin/env python3
"""Write a small census-shaped CSV for examples/wide_deep.est.

Not the real UCI Adult data (which cannot be downloaded here): rows drawn with Python's
`random` from a fixed seed, with the Adult data's columns, category names and messiness
(missing values written `?` or left empty), and an income bracket from a noisy rule
over age, education, hours and occupation, so that a model has something to learn.

Usage:
    python3 scripts/make_census_csv.py [OUT_DIR]

OUT_DIR defaults to examples/data. The output is deterministic.
"""

import math
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKCLASS = ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov", "Without-pay"]
EDUCATION = ["Preschool", "1st-4th", "5th-6th", "7th-8th", "9th", "10th", "11th", "12th", "HS-grad",
             "Some-college", "Assoc-voc", "Assoc-acdm", "Bachelors", "Masters", "Prof-school", "Doctorate"]
OCCUPATION = ["Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
              "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
              "Priv-house-serv", "Protective-serv", "Armed-Forces"]
SKILLED = {"Exec-managerial", "Prof-specialty", "Tech-support", "Sales", "Protective-serv"}


def row(rng):
    age = rng.randint(17, 80)
    work = rng.choices(WORKCLASS, weights=[70, 8, 4, 3, 6, 4, 1])[0]
    edu_i = min(15, max(0, int(rng.gauss(9.5, 2.5))))
    occ = rng.choice(OCCUPATION)
    hours = min(99, max(1, int(rng.gauss(40, 12))))
    gain = 0 if rng.random() < 0.9 else rng.randint(1000, 20000)
    z = (0.045 * (min(age, 60) - 38) + 0.35 * (edu_i - 9) + 0.03 * (hours - 40)
         + (0.8 if occ in SKILLED else -0.3) + (1.2 if gain > 5000 else 0.0) - 1.1 + rng.gauss(0, 0.8))
    label = 1 if 1 / (1 + math.exp(-z)) > 0.5 else 0
    fields = [str(age), work, EDUCATION[edu_i], occ, str(hours), str(gain), str(label)]
    # the Adult data's messiness: unknown categories as `?`, an hours field left empty
    if rng.random() < 0.05:
        fields[1] = "?"
    if rng.random() < 0.03:
        fields[3] = "?"
    if rng.random() < 0.02:
        fields[4] = ""
    return ",".join(fields)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "examples" / "data"
    rng = random.Random(1994)
    header = "age,workclass,education,occupation,hours_per_week,capital_gain,income_bracket"
    for name, n in [("census_train.csv", 800), ("census_test.csv", 200)]:
        lines = [header] + [row(rng) for _ in range(n)]
        (out / name).write_text("\n".join(lines) + "\n")
    (out / "census_workclass.txt").write_text("\n".join(WORKCLASS) + "\n")


if __name__ == "__main__":
    main()
