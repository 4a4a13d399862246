"""TorchRec's module paths (``torchrec.modules.*``): the embedding collections and their configs.

The implementations live in ``rectrain.embedding``; these modules make ``from torchrec.modules.X import Y``
port by changing ``torchrec`` to ``rectrain``.
"""
