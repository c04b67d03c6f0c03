"""The field report's verdict table, from the runner's JSON reports.

    python3 summary.py OUT_DIR APP...

One row per app (with the library's version), one column per check: B
BLOCKED, E EXPOSED, S SKIPPED, N NOT RUN; `+d` marks deviations.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def pinned(requirements, package):
    with open(os.path.join(HERE, requirements)) as lines:
        for line in lines:
            name, _, version = line.strip().partition("==")
            if name.lower() == package.lower():
                return f"{name}=={version}"
    return f"{package} (not pinned)"


def npm(package):
    with open(os.path.join(HERE, "package.json")) as text:
        return f"{package}@{json.load(text)['dependencies'][package]}"


def php():
    try:
        first = subprocess.run(["php", "--version"], capture_output=True, text=True).stdout
        return "PHP " + first.split()[1] + " + SQLite (php -S)"
    except (OSError, IndexError):
        return "PHP (not found)"


LIBRARIES = {
    "seed-php": php,
    "django-idempotency-key": lambda: pinned("requirements-django.txt", "django-idempotency-key")
    + ", " + pinned("requirements-django.txt", "Django"),
    "drf-idempotency": lambda: pinned("requirements-django.txt", "drf-idempotency")
    + ", " + pinned("requirements-django.txt", "djangorestframework") + ", Redis",
    "fastapi-idempotency": lambda: pinned("requirements-fastapi.txt", "fastapi-idempotency")
    + ", " + pinned("requirements-fastapi.txt", "starlette"),
    "asgi-idempotency-header": lambda: pinned("requirements-header.txt", "asgi-idempotency-header")
    + ", " + pinned("requirements-header.txt", "fastapi") + ", Redis",
    "powertools": lambda: npm("@aws-lambda-powertools/idempotency") + ", payload validation, Redis",
    "powertools-default": lambda: npm("@aws-lambda-powertools/idempotency") + ", no payload validation, Redis",
}
LETTER = {"blocked": "B", "exposed": "E", "skipped": "S", "not_run": "N"}


def verdict_of(check):
    verdict = check.get("verdict")
    if isinstance(verdict, dict):
        verdict = verdict.get("verdict")
    return str(verdict).lower().replace(" ", "_")


def main():
    out, apps = sys.argv[1], sys.argv[2:]
    reports = {}
    ids = []
    for app in apps:
        path = os.path.join(out, f"{app}.json")
        if not os.path.exists(path):
            continue
        with open(path) as text:
            reports[app] = json.load(text)
        for check in reports[app]["checks"]:
            if check["id"] not in ids:
                ids.append(check["id"])
    print("| app | library | " + " | ".join(ids) + " |")
    print("|---|---|" + "---|" * len(ids))
    for app, report in reports.items():
        cells = {}
        for check in report["checks"]:
            cell = LETTER.get(verdict_of(check), "?")
            if check.get("deviations"):
                cell += "+d"
            cells[check["id"]] = cell
        library = LIBRARIES.get(app, lambda: "")()
        print(f"| {app} | {library} | " + " | ".join(cells.get(i, "") for i in ids) + " |")
    print()
    print("B blocked, E exposed, S skipped, N not run, +d with deviations from the contract")


if __name__ == "__main__":
    main()
