"""The compiled core of the CPU fused embedding backward (numba, ``nogil``): count, order, bucket, update.

One *task* is one table, or one part of a table's rows (``row % parts == part``, ``parts`` a power of two)
when there are fewer tables than threads. A task turns the ids it owns from CSR (bags) into CSC (rows) with a
counting sort, then makes one pass over its rows in ascending order: it sums each row's output-gradient rows
(scaled by the per-sample weight, and by 1/length under MEAN) and updates the row's weights and optimizer
state in place, prefetching the rows it will update next. Ascending order and prefetching make the update
run at memory speed (measured: rows in first-seen order took 1.8x as long), as the rows a batch reads are
scattered over tables far larger than the caches.

``counts`` (one int32 per table row, zero between steps) is shared by all tasks; each row belongs to one
task, so tasks never touch the same entry. The rest of a task's scratch is its worker's own. A row's
gradient is summed in one fixed order (its positions in the batch), so results do not depend on the number
of threads. Tasks run on a small thread pool with the GIL released (``cpu_backward_runner``); numba's own
threading layer (and its OpenMP next to torch's) is never used.

Argument groups (tuples, so that signatures stay short): ``ids = (indices, offsets, per_sample_weights)``;
``lay = (feature_ptr, features, feature_col, rows, row_base, dims, weight_offsets, state_offsets)``, the
features of table ``t`` being ``features[feature_ptr[t]:feature_ptr[t + 1]]``; ``store = (weights, state1,
state2)`` flat fp32 buffers; ``scratch = (rows list, CSC gradient offsets, CSC scales)``.

The math is FBGEMM's CPU backward (SGD, Adagrad, row-wise Adagrad), and for Adam that of
``torch.optim.SparseAdam`` (``rectrain.embedding.sparse_adam``), all in fp32.
"""

from __future__ import annotations

import numpy as np

try:
    from llvmlite import ir
    from numba import njit, types, uint64
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - numba is a runtime dependency; the torch-ops backward remains
    njit = None

SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM = 0, 1, 2, 3
POOL_SUM, POOL_MEAN, POOL_NONE = 0, 1, 2
ROW_BLOCK, GRAD_AHEAD = 32, 8  # rows reduced, then updated, together; gradient rows prefetched ahead
FEATURE_PTR, FEATURES, FEATURE_COL, ROWS, ROW_BASE, DIMS, WEIGHT_OFFSETS, STATE_OFFSETS = range(8)


def available() -> bool:
    """Whether numba imported (the kernel may still fail to compile; see ``cpu_backward_runner``)."""
    return njit is not None


if njit is not None:

    @intrinsic
    def prefetch(typingctx, array, index):  # noqa: ARG001 - numba's intrinsic signature
        """``llvm.prefetch`` of ``array[index]``'s cache line into L2 (``prefetcht1``), not L1.

        The row loop prefetches a block of rows (about 160 lines) at a time; into L1 (``prefetcht0``) they
        queue for its few miss buffers and stall the loop: measured on an AMD EPYC (Zen 4), one thread,
        the standard tables, the whole backward took 37-44 ms with L1 prefetches and 24-30 ms with L2."""
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            view = context.make_array(array_type)(context, builder, args[0])
            pointer = cgutils.get_item_pointer(
                context, builder, array_type, view, [args[1]], wraparound=False
            )
            byte_pointer, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            function_type = ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32])
            function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.prefetch.p0")
            builder.call(function, [builder.bitcast(pointer, byte_pointer), i32(0), i32(2), i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    # Reassociation vectorises the row reductions; no approximate division or sqrt, no NaN/inf assumptions.
    _FAST = {"reassoc", "nsz", "contract"}
    _jit = njit(nogil=True, cache=True, fastmath=_FAST, boundscheck=False)
    # Per-row helpers are inlined: a call passing numba arrays costs more than a row's work.
    _inline = njit(nogil=True, cache=True, fastmath=_FAST, boundscheck=False, inline="always")

    @_inline
    def _prefetch_row(array, start, length):
        for line in range(0, length, 16):
            prefetch(array, uint64(start + line))

    @_jit
    def _count(t, part, parts, batch, ids, lay, counts, uniq):
        """Pass 1: count the ids of each owned row, listing each row once; -(position + 1) if out of range."""
        indices, offsets = ids[0], ids[1]
        n, base, num_rows, mask = 0, lay[ROW_BASE][t], lay[ROWS][t], parts - 1
        # The table's counts were last touched a step ago and are out of the caches by now; read at random
        # below, each one would wait for memory behind the branch on its value (measured: 35 ms of 327k ids
        # cold, 5 ms after this sweep, which streams them in at memory bandwidth).
        _prefetch_row(counts, base, num_rows)
        for j in range(lay[FEATURE_PTR][t], lay[FEATURE_PTR][t + 1]):
            f = lay[FEATURES][j]
            for pos in range(offsets[f * batch], offsets[(f + 1) * batch]):
                r = indices[pos]
                if r < 0 or r >= num_rows:
                    return -(pos + 1)
                if (r & mask) == part:
                    if counts[base + r] == 0:
                        uniq[n] = r
                        n += 1
                    counts[base + r] += 1
        return n

    @_jit
    def _radix_sort(values, n):
        """Sort ``values[:n]`` (non-negative int32) in place: LSD radix, 11 bits a pass (np.sort would add
        seconds to the kernel's compile)."""
        temp = np.empty(n, np.int32)
        buckets = np.empty(2048, np.int64)
        source, target = values, temp
        for shift in range(0, 33, 11):
            buckets[:] = 0
            for i in range(n):
                buckets[(source[i] >> shift) & 2047] += 1
            running = 0
            for b in range(2048):
                c = buckets[b]
                buckets[b] = running
                running += c
            for i in range(n):
                digit = (source[i] >> shift) & 2047
                target[buckets[digit]] = source[i]
                buckets[digit] += 1
            source, target = target, source
        values[:n] = source[:n]  # three passes: the sorted run ends in ``temp``

    @_jit
    def _order_rows(t, part, parts, n, lay, counts, uniq):
        """Pass 2: the owned rows in ascending order; ``counts[row]`` becomes the row's CSC start.

        Writes ``uniq[n]`` (one past the rows), so ``uniq`` holds at least one more than the ids."""
        base, num_rows = lay[ROW_BASE][t], lay[ROWS][t]
        if num_rows // parts <= 4 * n:  # dense enough that scanning the rows beats sorting them
            n = 0
            for r in range(part, num_rows, parts):
                uniq[n] = r  # branch-free: about a third of the rows are read, at random
                n += counts[base + r] != 0
        else:
            _radix_sort(uniq, n)
        running = 0
        for i in range(n):
            c = counts[base + uniq[i]]
            counts[base + uniq[i]] = running
            running += c

    @_jit
    def _bucket(t, part, parts, batch, pooling, has_weights, ids, lay, grad_width, counts, src, scale):
        """Pass 3: each owned id's gradient row (flat offset into the gradient) and scale into its row's CSC
        segment; ``counts[row]`` ends as the segment's end."""
        indices, offsets, psw = ids
        base, mask = lay[ROW_BASE][t], parts - 1
        for j in range(lay[FEATURE_PTR][t], lay[FEATURE_PTR][t + 1]):
            f = lay[FEATURES][j]
            for bag in range(f * batch, (f + 1) * batch):
                inverse_length = np.float32(1.0) / np.float32(max(1, offsets[bag + 1] - offsets[bag]))
                for pos in range(offsets[bag], offsets[bag + 1]):
                    r = indices[pos]
                    if (r & mask) != part:
                        continue
                    slot = counts[base + r]
                    counts[base + r] = slot + 1
                    if pooling == POOL_NONE:
                        src[slot] = pos * grad_width
                    else:
                        src[slot] = (bag - f * batch) * grad_width + lay[FEATURE_COL][f]
                    if pooling == POOL_MEAN:
                        scale[slot] = psw[pos] * inverse_length if has_weights else inverse_length
                    elif has_weights:
                        scale[slot] = psw[pos]

    @_inline
    def _update_row(optimizer, w0, s0, dim, store, acc, hp, step_size):
        """The optimizer's update of one row (weights at ``w0``, state at ``s0``) with gradient ``acc``."""
        weights, state1, state2 = store
        lr, eps = np.float32(hp[0]), np.float32(hp[1])
        w0, s0, n = uint64(w0), uint64(s0), uint64(dim)
        if optimizer == SGD:
            for d in range(n):
                weights[w0 + d] -= lr * acc[d]
        elif optimizer == ROWWISE_ADAGRAD:
            square_sum = np.float32(0.0)
            for d in range(n):
                square_sum += acc[d] * acc[d]
            moment = state1[s0] + square_sum / np.float32(dim)
            state1[s0] = moment
            multiplier = lr / (np.sqrt(moment) + eps)
            for d in range(n):
                weights[w0 + d] -= multiplier * acc[d]
        elif optimizer == ADAGRAD:
            for d in range(n):
                moment = state1[s0 + d] + acc[d] * acc[d]
                state1[s0 + d] = moment
                weights[w0 + d] -= lr * acc[d] / (np.sqrt(moment) + eps)
        else:
            # 1 - beta arrives rounded from double, as in torch's mul_(1 - beta) (fp32 1 - beta is 1e-5 off).
            one_minus_beta1, one_minus_beta2, decay = np.float32(hp[2]), np.float32(hp[3]), np.float32(hp[4])
            step = np.float32(-step_size)
            for d in range(n):
                g = acc[d] + decay * weights[w0 + d]
                avg = (g - state1[s0 + d]) * one_minus_beta1 + state1[s0 + d]
                avg_sq = (g * g - state2[s0 + d]) * one_minus_beta2 + state2[s0 + d]
                state1[s0 + d] = avg
                state2[s0 + d] = avg_sq
                weights[w0 + d] += avg / (np.sqrt(avg_sq) + eps) * step

    @_inline
    def _prefetch_rows(optimizer, rows, lo, hi, dim, per_row_state, w_base, s_base, store):
        """Prefetch the weight and state rows of ``rows[lo:hi]``."""
        for i in range(lo, hi):
            r = rows[i]
            _prefetch_row(store[0], w_base + r * dim, dim)
            if optimizer != SGD:
                _prefetch_row(store[1], s_base + r * per_row_state, per_row_state)
            if optimizer == ADAM:
                _prefetch_row(store[2], s_base + r * per_row_state, per_row_state)

    @_inline
    def _rows_loop(optimizer, t, n, scaled, grad, scratch, lay, counts, store, hp, step_size, acc):
        """Pass 4 for one optimizer: owned rows ascending, a block of ``ROW_BLOCK`` at a time: sum each row's
        CSC segment of gradient rows into ``acc[row in block]``, then update the block's rows, whose weights
        and state were prefetched while the previous block ran (measured: 1.45x faster than row by row)."""
        uniq, src, scale = scratch
        base, dim = lay[ROW_BASE][t], lay[DIMS][t]
        per_row_state = 1 if optimizer == ROWWISE_ADAGRAD else dim
        w_base, s_base, n_dim = lay[WEIGHT_OFFSETS][t], lay[STATE_OFFSETS][t], uint64(dim)
        total = counts[base + uniq[n - 1]] if n else 0
        start = 0
        _prefetch_rows(optimizer, uniq, 0, min(n, ROW_BLOCK), dim, per_row_state, w_base, s_base, store)
        for lo in range(0, n, ROW_BLOCK):
            hi = min(n, lo + ROW_BLOCK)
            _prefetch_rows(
                optimizer, uniq, hi, min(n, hi + ROW_BLOCK), dim, per_row_state, w_base, s_base, store
            )
            for i in range(lo, hi):
                end = counts[base + uniq[i]]
                counts[base + uniq[i]] = 0
                row_acc = acc[i - lo]
                for d in range(n_dim):
                    row_acc[d] = 0.0
                for k in range(start, end):
                    if k + GRAD_AHEAD < total:
                        _prefetch_row(grad, src[k + GRAD_AHEAD], dim)
                    g0 = uint64(src[k])
                    c = scale[k] if scaled else np.float32(1.0)
                    for d in range(n_dim):
                        row_acc[d] += c * grad[g0 + d]
                start = end
            for i in range(lo, hi):
                r = uniq[i]
                w0, s0 = w_base + r * dim, s_base + r * per_row_state
                _update_row(optimizer, w0, s0, dim, store, acc[i - lo], hp, step_size)

    @_jit
    def _undo_count(t, part, parts, batch, ids, lay, counts):
        """Zero the counts a task that met an out-of-range id had made, so ``counts`` stays all zero."""
        indices, offsets = ids[0], ids[1]
        for j in range(lay[FEATURE_PTR][t], lay[FEATURE_PTR][t + 1]):
            f = lay[FEATURES][j]
            for pos in range(offsets[f * batch], offsets[(f + 1) * batch]):
                r = indices[pos]
                if 0 <= r < lay[ROWS][t] and (r & (parts - 1)) == part:
                    counts[lay[ROW_BASE][t] + r] = 0

    def _make_run_tasks(optimizer):
        """``run_tasks`` for one optimizer, a compile-time constant, so that LLVM specialises the row loop (a
        run-time switch inside it made the pass 1.4x slower) and only the optimizers in use get compiled."""

        @_jit
        def run_tasks(
            tasks, parts, batch, pooling, ids, grad, grad_width, lay, store, steps, hp, counts, scratch
        ):
            """Run ``tasks`` (``table * parts + part``) in turn; the first out-of-range id's position, or -1.

            ``grad`` is the flat output gradient, ``grad_width`` its row length; ``steps`` Adam's step size
            per table; ``hp`` (lr, eps, 1 - beta1, 1 - beta2, weight_decay)."""
            has_weights = ids[2].size > 0
            scaled = has_weights or pooling == POOL_MEAN
            acc = np.empty((ROW_BLOCK, max(1, lay[DIMS].max())), np.float32)
            for k in range(tasks.shape[0]):
                t, part = tasks[k] // parts, tasks[k] & (parts - 1)
                n = _count(t, part, parts, batch, ids, lay, counts, scratch[0])
                if n < 0:
                    _undo_count(t, part, parts, batch, ids, lay, counts)
                    return -n - 1
                _order_rows(t, part, parts, n, lay, counts, scratch[0])
                _bucket(
                    t,
                    part,
                    parts,
                    batch,
                    pooling,
                    has_weights,
                    ids,
                    lay,
                    grad_width,
                    counts,
                    scratch[1],
                    scratch[2],
                )
                _rows_loop(optimizer, t, n, scaled, grad, scratch, lay, counts, store, hp, steps[t], acc)
            return -1

        return run_tasks

    RUN_TASKS = {optimizer: _make_run_tasks(optimizer) for optimizer in (SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM)}

else:  # pragma: no cover
    RUN_TASKS = {}
