#!/usr/bin/env python3
"""CDK entry point: `cdk synth/deploy` (via cdk.json) or `python app.py` (writes ./cdk.out)."""

import os
import sys
from pathlib import Path

# infra/ imports the core package (batchinfer.catalog owns the catalog format and resource names); the CDK CLI
# runs this file without the PYTHONPATH that make and pytest set.
sys.path.insert(0, str(Path(__file__).resolve().parent / "layers" / "core" / "python"))

# jsii's Node version banners are noise in CI logs; the synth itself works on Node 20.
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra.stack import build_app  # noqa: E402  (after the environment above: it starts the jsii runtime)

app, _stack = build_app()
app.synth()
