"""Reads a Prometheus page (text format 0.0.4) on stdin with the official
`prometheus_client` parser and prints its samples as JSON lines, one per
sample: {"family": ..., "type": ..., "name": ..., "labels": {...}, "value": ...}.
A page the parser refuses makes it exit non-zero."""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    page = sys.stdin.read()
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            value = sample.value
            if math.isinf(value):
                value = "+Inf" if value > 0 else "-Inf"
            elif math.isnan(value):
                value = "NaN"
            print(json.dumps({
                "family": family.name,
                "type": family.type,
                "name": sample.name,
                "labels": sample.labels,
                "value": value,
            }))


if __name__ == "__main__":
    main()
