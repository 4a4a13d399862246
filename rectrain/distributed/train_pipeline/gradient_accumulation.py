"""``torchrec.distributed.train_pipeline.gradient_accumulation`` at rectrain's path: the engine module itself.

It is ``rectrain.train.gradient_accumulation`` under this name too (one module object), so what code patches
here (TorchRec's tests patch ``DistributedDataParallel`` in this module) is what the engine uses.
"""

import sys

from rectrain.train import gradient_accumulation

sys.modules[__name__] = gradient_accumulation
