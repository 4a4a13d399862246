"""``torch.fx`` tracing of models that take sparse types (TorchRec's ``torchrec.fx``)."""

from rectrain.fx.tracer import Tracer, is_fx_tracing, symbolic_trace

__all__ = ["Tracer", "is_fx_tracing", "symbolic_trace"]
