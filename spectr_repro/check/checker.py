"""The items of ``check`` and the checker that runs them: a crash is a failed item, not a traceback."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Item:
    section: str
    name: str
    status: str  # "pass", "fail", "info", "skip"
    detail: str
    required: bool = False  # counts for the exit status
    seconds: float = 0.0


class Checker:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, section: str, name: str, status: str, detail: str, required: bool = False,
            seconds: float = 0.0) -> Item:
        item = Item(section, name, status, detail, required, round(seconds, 3))
        self.items.append(item)
        print(f"  [{status}] {section}: {name} - {detail}", file=sys.stderr, flush=True)
        return item

    def run(self, section: str, name: str, function, required: bool = True) -> Any:
        """``function()`` -> (passed: bool | None, detail, value); an exception is a failure with its message."""
        start = time.perf_counter()
        try:
            passed, detail, value = function()
        except Exception as error:  # a check that crashes on this device is a failed check, not a traceback
            self.add(section, name, "fail", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
                     required, time.perf_counter() - start)
            return None
        status = "info" if passed is None else ("pass" if passed else "fail")
        self.add(section, name, status, detail, required and passed is not None, time.perf_counter() - start)
        return value

    @property
    def passed(self) -> bool:
        return all(item.status != "fail" for item in self.items if item.required)


__all__ = ["Checker", "Item"]
