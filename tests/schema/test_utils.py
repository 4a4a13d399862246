"""``rectrain.schema.utils.is_signature_compatible``: TorchRec's backward-compatibility rule."""

from __future__ import annotations

import inspect
import typing

import torch

from rectrain.schema.utils import is_signature_compatible


def _sig(source: str) -> inspect.Signature:
    # typing's old generics, as TorchRec's stable signatures spell them; no postponed annotations here.
    namespace: dict = {name: getattr(typing, name) for name in ("Optional", "List", "Dict")}
    namespace["torch"] = torch
    exec(compile(source, "<signature>", "exec", dont_inherit=True), namespace)  # noqa: S102 - a literal
    return inspect.signature(namespace["f"])


STABLE = "def f(a: int, b: Optional[List[int]] = None, *, c: str = 'x') -> Dict[str, int]: ..."


def test_additions_at_the_end_and_new_spellings_stay_compatible():
    added = (
        "def f(a: int, b: list[int] | None = None, *, e: int = 1, c: str = 'x', d: int = 0)"
        " -> dict[str, int]: ..."
    )
    assert is_signature_compatible(_sig(STABLE), _sig(added))


def test_renamed_reordered_retyped_or_removed_parameters_break_compatibility():
    for broken in [
        "def f(x: int, b: Optional[List[int]] = None, *, c: str = 'x') -> Dict[str, int]: ...",
        "def f(b: Optional[List[int]], a: int, *, c: str = 'x') -> Dict[str, int]: ...",
        "def f(a: str, b: Optional[List[int]] = None, *, c: str = 'x') -> Dict[str, int]: ...",
        "def f(a: int, b: Optional[List[int]] = (), *, c: str = 'x') -> Dict[str, int]: ...",
        "def f(a: int, b: Optional[List[int]] = None, *, d: str = 'x') -> Dict[str, int]: ...",
        "def f(a: int, b: Optional[List[int]] = None, *, c: str = 'x') -> Dict[str, str]: ...",
        "def f(a: int) -> Dict[str, int]: ...",
    ]:
        assert not is_signature_compatible(_sig(STABLE), _sig(broken)), broken


def test_anything_may_be_inserted_before_kwargs_and_parameters_may_widen():
    stable = _sig("def f(a: int, **kwargs) -> None: ...")
    assert is_signature_compatible(stable, _sig("def f(a: int, b: int = 0, **kwargs) -> None: ..."))
    widened = _sig("def f(t: torch.Tensor) -> None: ...")
    assert is_signature_compatible(_sig("def f(t: torch.nn.Parameter) -> None: ..."), widened)
    assert not is_signature_compatible(widened, _sig("def f(t: torch.nn.Parameter) -> None: ..."))


def test_postponed_annotation_text_compares_with_typing_objects():
    text = inspect.Signature(
        [
            inspect.Parameter(
                "b", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Optional[torch.Tensor]"
            )
        ],
        return_annotation="typing.List[torch.Tensor]",
    )
    typed = _sig("def f(b: torch.Tensor | None) -> list[torch.Tensor]: ...")
    assert is_signature_compatible(text, typed)
