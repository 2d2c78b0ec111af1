"""Regenerate server.json's environment variables from the README configuration table.

    python scripts/server_json.py

tests/unit/test_config.py fails when server.json, the README table and Settings disagree.
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOLEANS = {"SANDBOX_READ_ONLY", "SANDBOX_PRIVILEGED", "COMMIT_CONTAINER", "KEEP_TEMPLATE"}
NUMBERS = re.compile(
    r"^(SANDBOX_(TIMEOUT|MAX_TIMEOUT|INSTALL_TIMEOUT|CPUS|CPU_COUNT|PIDS_LIMIT|NOFILE_LIMIT|POOL_SIZE"
    r"|MAX_CONCURRENCY|MAX_SESSIONS|SESSION_IDLE_TTL|SESSION_MAX_LIFETIME|SESSION_MAX_CPUS|K8S_START_TIMEOUT))$"
)


def main() -> None:
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (.*?) \| (.*) \|$", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    variables: list[dict[str, object]] = []
    for name, default, meaning in rows:
        item: dict[str, object] = {
            "name": name,
            "description": meaning.replace("`", ""),
            "isRequired": False,
            "format": "string",
        }
        if name in BOOLEANS:
            item["format"] = "boolean"
        elif NUMBERS.match(name):
            item["format"] = "number"
        value = default.strip("`")
        if value not in ("unset", "—"):
            item["default"] = value
        variables.append(item)
    manifest = json.loads((ROOT / "server.json").read_text())
    manifest["packages"][0]["environmentVariables"] = variables
    (ROOT / "server.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
