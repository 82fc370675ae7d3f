"""The subset of Sigma the shipped SIEM rules use (packaging/sigma), matched against one log record."""

from __future__ import annotations


def record_value(doc: dict, dotted: str):
    """The value at a dotted ECS path (`process.name`), or None where the record has none."""
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def sigma_matches(rule: dict, doc: dict) -> bool:
    """The subset of Sigma these rules use: maps of field[|exists] -> value or list; 'a and b'."""
    detection = rule["detection"]

    def selection(name: str) -> bool:
        for key, want in detection[name].items():
            field, _, modifier = key.partition("|")
            have = record_value(doc, field)
            if modifier == "exists":
                if (have is not None) != want:
                    return False
                continue
            wants = want if isinstance(want, list) else [want]
            haves = have if isinstance(have, list) else [have]
            if not any(str(h) == str(w) for h in haves for w in wants):
                return False
        return True

    return all(selection(name.strip()) for name in detection["condition"].split(" and "))
