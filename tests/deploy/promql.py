"""A small PromQL reader: the metrics an expression selects, with which labels, and the labels it groups by.

Enough for alert rules and dashboard queries (selectors, functions, aggregations with ``by``/``without``,
binary operators, ranges, Grafana's ``$variables``); it does not evaluate anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?", re.IGNORECASE)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk"}
_AGGREGATIONS |= {"quantile", "count_values", "limitk", "limit_ratio"}
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")


@dataclass
class Selector:
    metric: str
    labels: dict[str, str] = field(default_factory=dict)  # label -> the matched string (regexes unexpanded)


@dataclass
class Query:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def _string_end(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string at {start} in {text!r}")


def _read_matchers(text: str, start: int) -> tuple[dict[str, str], int]:
    """Parses ``{a="x", b=~"y"}`` starting at ``{``; returns the matchers and the index after ``}``."""
    labels: dict[str, str] = {}
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\n,":
            i += 1
        if text[i] == "}":
            return labels, i + 1
        match = _MATCHER.match(text, i)
        if not match or text[match.end()] not in "\"'`":
            raise ValueError(f"cannot read label matcher at {i} in {text!r}")
        end = _string_end(text, match.end())
        labels[match.group(1)] = text[match.end() + 1 : end - 1]
        i = end


def _next_char(text: str, i: int) -> str:
    while i < len(text) and text[i].isspace():
        i += 1
    return text[i] if i < len(text) else ""


def parse(expr: str) -> Query:
    query, i, grouping_next = Query(), 0, False
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            i = _string_end(expr, i)
        elif ch == "[":
            i = expr.index("]", i) + 1
        elif ch == "$":  # a Grafana variable outside a string, e.g. $__range
            variable = _IDENT.match(expr, i + 1)
            i = variable.end() if variable else i + 1
        elif ch == "{":
            labels, i = _read_matchers(expr, i)
            name = labels.pop("__name__", None)
            if name:
                query.selectors.append(Selector(name, labels))
        elif ch.isdigit() or (ch == "." and expr[i + 1 : i + 2].isdigit()):
            i = _NUMBER.match(expr, i).end()
        elif _IDENT.match(expr, i):
            word = _IDENT.match(expr, i).group(0)
            i += len(word)
            follow = _next_char(expr, i)
            if word.lower() in _GROUPING:
                grouping_next = True
            elif follow == "(" or word.lower() in _KEYWORDS | _AGGREGATIONS:
                pass  # a function, an aggregation or an operator keyword
            else:
                selector = Selector(word)
                if follow == "{":
                    i = expr.index("{", i)
                    selector.labels, i = _read_matchers(expr, i)
                query.selectors.append(selector)
        elif ch == "(" and grouping_next:
            close = expr.index(")", i)
            query.grouping |= {label.strip() for label in expr[i + 1 : close].split(",") if label.strip()}
            grouping_next, i = False, close + 1
        else:
            i += 1
    return query
