"""``torchrec.inference.model_packager`` at rectrain's path: refused, as it writes and reads torch.package.

TorchRec packages a ``PredictFactory`` with ``torch.package`` (pickled code) for its torch.deploy server.
rectrain's packaged model is a recserve model package (safetensors + JSON manifest, no pickled code):
``recserve.export.export_package(out_dir, model_config=..., model=model)`` writes it from the trained or
quantized model, ``recserve.runtime.Predictor.load(out_dir)`` serves it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from rectrain.inference.refusals import refused


def load_config_text(name: str) -> NoReturn:
    raise refused("load_config_text")


def load_pickle_config(name: str, clazz: type) -> NoReturn:
    raise refused("load_pickle_config")


class PredictFactoryPackager:
    """TorchRec's torch.package writer for a ``PredictFactory``; every entry point is refused by name."""

    @classmethod
    def set_extern_modules(cls, pe: Any) -> NoReturn:
        raise refused("PredictFactoryPackager")

    @classmethod
    def set_mocked_modules(cls, pe: Any) -> NoReturn:
        raise refused("PredictFactoryPackager")

    @classmethod
    def save_predict_factory(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise refused("PredictFactoryPackager")
