"""Checks that tie the chart's `config` value to weir's config types (run by test_chart.py).

The chart's values.schema.json `config` block is generated from the types (the cargo test
`config::schema` fails on drift); here: a values file that sets every field the generated
schema lists (ci/every-field-values.yaml) renders a config that names each of them with
the value given, and `weir config check` (run on every case by inject_checks) accepts it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def leaf_paths(schema: dict, prefix: tuple = ()) -> list[tuple]:
    props = schema.get("properties")
    if not props:
        return [prefix]
    return [p for name, sub in props.items() for p in leaf_paths(sub, prefix + (name,))]


def lookup(doc, path: tuple):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            raise KeyError(".".join(path))
        doc = doc[key]
    return doc


def check_every_field_settable(objects: list[dict], weir: Path) -> None:
    out = subprocess.run([str(weir), "config", "schema", "--chart"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    checked = json.loads((REPO / "charts" / "weir" / "values.schema.json").read_text())["properties"]["config"]
    assert schema == checked, "values.schema.json `config` is not `weir config schema --chart` (cargo test -p proxy --lib config::schema)"
    values = yaml.load((REPO / "charts" / "weir" / "ci" / "every-field-values.yaml").read_text(), Loader=Loader)["config"]
    [cm] = [o for o in objects if o.get("kind") == "ConfigMap" and o["metadata"]["name"].endswith("-config")]
    rendered = yaml.load(cm["data"]["config.yaml"], Loader=Loader)
    paths = leaf_paths(schema)
    assert len(paths) >= 60, f"only {len(paths)} fields in the generated schema"
    problems = []
    for path in paths:
        name = ".".join(path)
        try:
            given = lookup(values, path)
        except KeyError:
            problems.append(f"{name}: not set by ci/every-field-values.yaml")
            continue
        try:
            got = lookup(rendered, path)
        except KeyError:
            problems.append(f"{name}: missing from the rendered config")
            continue
        if got != given:
            problems.append(f"{name}: rendered {got!r}, values say {given!r}")
    # The chart-owned file paths are there too, filled in by the chart.
    for owned in ("token_file", "user_secret_file", "table_file", "state_path"):
        if not isinstance(rendered["admin"].get(owned), str):
            problems.append(f"admin.{owned}: the chart did not fill it in")
    assert not problems, "\n".join(problems)
