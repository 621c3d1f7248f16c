#!/usr/bin/env python3
"""Dump the scalars of a TensorBoard run directory as JSON, using tensorboard's reader.

Usage:
    bench/.venv/bin/python scripts/read_events.py DIR [--expect-tags loss,learning_rate,...]

DIR is a run directory holding one or more events.out.tfevents.* files (read
together, in order, by tensorboard's EventAccumulator; every scalar is kept).
Prints one JSON object:
    {"dir": DIR, "scalars": {tag: [[step, value], ...], ...}}
Exits 1 with a message on stderr when DIR holds no scalars, or when a tag named
in --expect-tags (comma-separated) is missing.

Only classic simple_value scalars (what torch's SummaryWriter and tf.compat.v1
write) are seen; TF2-style tensor scalars (tf.summary.scalar) are not.
"""

import argparse
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import (
    SCALARS,
    EventAccumulator,
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--expect-tags", default="",
                        help="comma-separated scalar tags that must be present")
    args = parser.parse_args()

    acc = EventAccumulator(args.dir, size_guidance={SCALARS: 0})
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value] for e in acc.Scalars(tag)]
        for tag in sorted(acc.Tags()[SCALARS])
    }
    if not scalars:
        sys.exit(f"read_events: no scalars in {args.dir}")
    missing = [t for t in args.expect_tags.split(",") if t and t not in scalars]
    if missing:
        sys.exit(f"read_events: missing tags {missing} in {args.dir}; "
                 f"found {sorted(scalars)}")
    print(json.dumps({"dir": args.dir, "scalars": scalars}))


if __name__ == "__main__":
    main()
