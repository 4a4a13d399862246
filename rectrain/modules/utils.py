"""Helpers of ``torchrec.modules.utils`` that TorchRec users call on their models."""

import torch
from torch import Tensor, nn

from rectrain.sparse import JaggedTensor, KeyedJaggedTensor

_BUCKET_BUFFER = "_hash_zch_bucket"  # HashZchManagedCollisionModule.BUCKET_BUFFER


def make_hash_zch_buckets_non_persistent(module: nn.Module) -> int:
    """Leave the bucket count of every ``HashZchManagedCollisionModule`` under ``module`` out of
    ``state_dict`` (it follows from the config), so checkpoints written before it existed still load.

    Returns how many modules changed.
    """
    changed = 0
    for submodule in module.modules():
        if (
            _BUCKET_BUFFER in submodule._buffers
            and _BUCKET_BUFFER not in submodule._non_persistent_buffers_set
        ):
            submodule._non_persistent_buffers_set.add(_BUCKET_BUFFER)
            changed += 1
    return changed


def construct_jagged_tensors(
    embeddings: Tensor,
    features: KeyedJaggedTensor,
    embedding_names: list[str],
    need_indices: bool = False,
    features_to_permute_indices: dict[str, list[int]] | None = None,
    original_features: KeyedJaggedTensor | None = None,
    reverse_indices: Tensor | None = None,
    seq_vbe_ctx: object | None = None,
    use_gather_select: bool = False,
) -> dict[str, JaggedTensor]:
    """A sequence lookup's rows as one ``JaggedTensor`` per embedding name.

    ``embeddings`` holds one row per id of ``features`` (``original_features`` if given), feature-major;
    ``embedding_names`` names each feature's block. Blocks with the same name (a column-wise table's shards)
    are joined along columns, in ``features_to_permute_indices[name]`` order when given. ``reverse_indices``
    maps each id to its row when the lookup ran on de-duplicated ids (``use_gather_select``: by
    ``torch.gather`` instead of ``index_select``; same result). ``need_indices``: the ids become the weights.
    """
    if seq_vbe_ctx is not None:
        raise NotImplementedError(
            "construct_jagged_tensors: variable-batch sequence outputs (seq_vbe_ctx) are not supported"
        )
    if original_features is not None:
        features = original_features
    if reverse_indices is not None:
        if use_gather_select:
            rows = reverse_indices.unsqueeze(1).expand(-1, embeddings.size(1))
            embeddings = torch.gather(embeddings, 0, rows)
        else:
            embeddings = torch.index_select(embeddings, 0, reverse_indices)
    lengths = features.lengths().view(-1, features.stride()).unbind(0)
    per_key = features.length_per_key()
    blocks = torch.split(embeddings, per_key, dim=0)
    ids = torch.split(features.values(), per_key) if need_indices else None
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(embedding_names):
        positions.setdefault(name, []).append(i)
    out = {}
    for name, where in positions.items():
        if features_to_permute_indices and name in features_to_permute_indices:
            where = [where[j] for j in features_to_permute_indices[name]]
        out[name] = JaggedTensor(
            values=blocks[where[0]] if len(where) == 1 else torch.cat([blocks[i] for i in where], dim=1),
            lengths=lengths[where[0]],
            weights=ids[where[0]] if ids is not None else None,
        )
    return out
