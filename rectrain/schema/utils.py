"""``torchrec.schema.utils``: is a function's current signature backward compatible with a stable one?

Compatible means every call the stable signature accepted is still accepted with the same meaning: no
parameter removed, positional parameters keep their place, name, annotation and default, every keyword-only
parameter is still there (in any order), anything may be added before ``**kwargs`` or at the end, and the
return annotation is the same. Generics are compared argument by argument, with ``Optional[X]`` the same as
``X | None`` and ``List[X]`` as ``list[X]``; a parameter may widen to a base class of its previous annotation.
Modules with postponed annotations (PEP 563) hold annotation *text*: text is compared with a typing object
by spelling both the same way (a class by its bare name).
"""

from __future__ import annotations

import inspect
import re
import types
import typing

_BUILTIN_GENERICS = {"List": "list", "Dict": "dict", "Tuple": "tuple", "Set": "set", "Type": "type"}


def _spelling(annotation: object) -> str:
    """One canonical text for an annotation, typing object or text."""
    if isinstance(annotation, str):
        text = re.sub(r"\b[\w]+\.(?=\w)", "", annotation)  # torch.Tensor -> Tensor, typing.List -> List
        text = re.sub(r"^Optional\[(.*)\]$", r"\1 | None", text)
        for old, new in _BUILTIN_GENERICS.items():
            text = re.sub(rf"\b{old}\[", f"{new}[", text)
        return text.replace(" ", "").replace("NoneType", "None")
    if annotation is None or annotation is type(None):
        return "None"
    origin, args = _origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return "|".join(sorted((_spelling(a) for a in args), key=lambda s: s == "None"))
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{','.join(_spelling(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation)).replace(" ", "")


def _origin(annotation: object) -> object:
    origin = typing.get_origin(annotation)
    return typing.Union if origin is types.UnionType else origin  # Optional[X] is X | None


def _same_annotation(previous: object, current: object, parameter: bool = False) -> bool:
    """Equal annotations; generics compared argument by argument. A parameter may widen to a base class of
    its previous annotation (every value the previous one accepted is still accepted)."""
    if isinstance(previous, typing.ForwardRef):
        previous = previous.__forward_arg__
    if isinstance(current, typing.ForwardRef):
        current = current.__forward_arg__
    if previous == current:
        return True
    if isinstance(previous, str) or isinstance(current, str):
        return _spelling(previous) == _spelling(current)
    if (
        parameter
        and isinstance(previous, type)
        and isinstance(current, type)
        and issubclass(previous, current)
    ):
        return True
    if _origin(previous) is None or _origin(previous) != _origin(current):
        return False
    previous_args, current_args = typing.get_args(previous), typing.get_args(current)
    return len(previous_args) == len(current_args) and all(
        _same_annotation(p, c, parameter) for p, c in zip(previous_args, current_args)
    )


def is_signature_compatible(
    previous_signature: inspect.Signature, current_signature: inspect.Signature
) -> bool:
    """True if every call ``previous_signature`` accepts, ``current_signature`` accepts alike."""
    previous = list(previous_signature.parameters.values())
    current = list(current_signature.parameters.values())
    if len(previous) > len(current):
        return False
    for old, new in zip(previous, current):
        if old.kind is inspect.Parameter.VAR_KEYWORD:
            continue  # anything may be inserted before **kwargs
        if old.kind != new.kind:
            return False
        if old.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and not (
            old.name == new.name
            and _same_annotation(old.annotation, new.annotation, parameter=True)
            and old.default == new.default
        ):
            return False
    keyword_only = inspect.Parameter.KEYWORD_ONLY
    if {p.name for p in previous if p.kind is keyword_only} - {
        p.name for p in current if p.kind is keyword_only
    }:
        return False
    return _same_annotation(previous_signature.return_annotation, current_signature.return_annotation)
