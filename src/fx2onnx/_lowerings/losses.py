"""Losses: cross entropy, chunked linear cross entropy, CTC."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import INT64
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import TFloat, TIndex, TInt, _back, _const, _in_float32, _log_softmax
from fx2onnx._lowerings.rules import lowering


@lowering("aten::cross_entropy_loss")
def cross_entropy_probabilities(
    self: TFloat,
    target: TFloat,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class probabilities (a float target shaped like the input).

    loss[n, ...] = -sum_c weight[c] * target[n, c, ...] * log_softmax(input)[n, c, ...]; mean divides by the
    number of samples (not by the weights). Integer class targets keep torchlib's implementation.
    """
    del ignore_index  # only class-index targets have one
    x, probabilities = _in_float32(self), _in_float32(target)
    rank = len(self.shape)
    class_axis = 1 if rank > 1 else 0
    classes = self.shape[class_axis]
    if label_smoothing > 0:
        probabilities = op.Add(
            op.Mul(probabilities, _const(1.0 - label_smoothing, x)), _const(label_smoothing / classes, x)
        )
    log_probabilities = _log_softmax(x, class_axis)  # NaN rows as eager's
    terms = op.Mul(probabilities, log_probabilities)
    if weight is not None:
        shape = [1] * rank
        shape[class_axis] = -1
        terms = op.Mul(terms, op.Reshape(_in_float32(weight), op.Constant(value_ints=shape)))
    losses = op.Neg(op.ReduceSum(terms, op.Constant(value_ints=[class_axis]), keepdims=False))
    if reduction == 0:
        result = losses
    elif reduction == 2:
        result = op.ReduceSum(losses, keepdims=False)
    else:
        result = op.ReduceMean(losses, keepdims=False)
    return _back(result, self)


# --- cross entropy with class-index targets ---------------------------------------------------------------------------
# torchlib's aten::cross_entropy_loss ignores label_smoothing and fails on unbatched input ([C] logits, 0-d target).
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _class_cross_entropy(
    logits: TFloat,
    target: INT64,
    weight: TFloat | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
) -> TFloat:
    """Eager's cross_entropy for class indices, in the logits' dtype (callers pass float32 for half types).

    Per sample: (1 - s) * w[t] * -log_softmax[t] + s / C * sum_c w[c] * -log_softmax[c], ignored samples 0;
    'mean' divides both sums by the sum of w[t] over the kept samples (NaN when every sample is ignored).
    """
    unbatched = len(logits.shape) == 1
    rank = max(len(logits.shape), 2)
    zero_axis = op.Constant(value_ints=[0])
    if unbatched:
        logits, target = op.Unsqueeze(logits, zero_axis), op.Unsqueeze(target, zero_axis)
    class_axis = op.Constant(value_ints=[1])
    log_probabilities = _log_softmax(logits, 1)  # NaN rows as eager's
    ignored = op.Equal(target, op.Constant(value_int=ignore_index))
    safe_target = op.Where(ignored, op.Constant(value_int=0), target)
    picked = op.Squeeze(op.GatherElements(log_probabilities, op.Unsqueeze(safe_target, class_axis), axis=1), class_axis)
    zero = op.CastLike(0.0, logits)
    if weight is not None:
        target_weight = op.Where(ignored, zero, op.Gather(weight, safe_target, axis=0))
    else:
        target_weight = op.Where(ignored, zero, op.CastLike(1.0, logits))
    losses = op.Neg(op.Mul(picked, target_weight))
    smooth = None
    if label_smoothing > 0:
        terms = log_probabilities
        if weight is not None:
            terms = op.Mul(terms, op.Reshape(weight, op.Constant(value_ints=[1, -1] + [1] * (rank - 2))))
        smooth = op.Where(ignored, zero, op.Neg(op.ReduceSum(terms, class_axis, keepdims=False)))
        classes = op.CastLike(op.Shape(logits, start=1, end=2), logits)
        smooth = op.Div(op.Mul(smooth, op.CastLike(label_smoothing, logits)), classes)
        losses = op.Mul(losses, op.CastLike(1.0 - label_smoothing, logits))
    if reduction == "none":
        result = losses if smooth is None else op.Add(losses, smooth)
        return op.Squeeze(result, zero_axis) if unbatched else result
    total = op.ReduceSum(losses, keepdims=False)
    if smooth is not None:
        total = op.Add(total, op.ReduceSum(smooth, keepdims=False))
    if reduction == "sum":
        return total
    return op.Div(total, op.ReduceSum(target_weight, keepdims=False))


@lowering("aten::cross_entropy_loss")
def cross_entropy_loss_classes(
    self: TFloat,
    target: INT64,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class indices: unbatched inputs and label smoothing as in eager."""
    x = _in_float32(self)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _class_cross_entropy(x, target, class_weight, _REDUCTIONS[reduction], ignore_index, label_smoothing)
    return _back(loss, self)


# --- negative log likelihood ---------------------------------------------------------------------------------------
# torchlib's aten::nll_loss_forward requires `weight`: `F.nll_loss(x, t)` (weight None) had no implementation.
def _nll_loss(
    self: TFloat, target: INT64, weight: TFloat | None, reduction: int, ignore_index: int
) -> tuple[TFloat, TFloat]:
    """Eager's nll_loss_forward / nll_loss2d_forward: (output, total_weight), in the input's dtype (callers pass
    float32 for half types). An ignored sample's loss is +0.0 and weighs 0; 'mean' divides by the total weight
    (NaN when every sample is ignored); total_weight is 0 with 'none', except for unbatched input."""
    unbatched = len(self.shape) == 1
    zero_axis, class_axis = op.Constant(value_ints=[0]), op.Constant(value_ints=[1])
    if unbatched:
        self, target = op.Unsqueeze(self, zero_axis), op.Unsqueeze(target, zero_axis)
    ignored = op.Equal(target, op.Constant(value_int=ignore_index))
    safe_target = op.Where(ignored, op.Constant(value_int=0), target)
    picked = op.Squeeze(op.GatherElements(self, op.Unsqueeze(safe_target, class_axis), axis=1), class_axis)
    zero = op.CastLike(0.0, self)
    class_weight = op.Gather(weight, safe_target, axis=0) if weight is not None else op.CastLike(1.0, self)
    target_weight = op.Where(ignored, zero, class_weight)
    losses = op.Where(ignored, zero, op.Neg(op.Mul(picked, target_weight)))
    total_weight = op.ReduceSum(target_weight, keepdims=False)
    if reduction == 0:
        return (op.Squeeze(losses, zero_axis) if unbatched else losses), (total_weight if unbatched else zero)
    total = op.ReduceSum(losses, keepdims=False)
    return (total if reduction == 2 else op.Div(total, total_weight)), total_weight


@lowering("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(
    self: TFloat, target: INT64, weight: TFloat | None = None, reduction: int = 1, ignore_index: int = -100
) -> tuple[TFloat, TFloat]:
    class_weight = _in_float32(weight) if weight is not None else None
    output, total_weight = _nll_loss(_in_float32(self), target, class_weight, reduction, ignore_index)
    return _back(output, self), _back(total_weight, self)


def _linear_logits(input: TFloat, linear_weight: TFloat, linear_bias: TFloat | None) -> TFloat:
    """input @ linear_weight.T (+ bias) in float32: [N, H] x [C, H] -> [N, C]."""
    x = _in_float32(input)
    logits = op.MatMul(x, op.Transpose(op.CastLike(linear_weight, x), perm=[1, 0]))
    if linear_bias is not None:
        logits = op.Add(logits, op.CastLike(linear_bias, x))
    return logits


def _empty_gradient(like: TFloat, rank: int) -> TFloat:
    return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0] * rank)), like)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy_batch_chunked(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
    allow_retain_graph: bool = False,
    compute_input_grad: bool = False,
    compute_linear_weight_grad: bool = False,
    compute_linear_bias_grad: bool = False,
) -> tuple[TFloat, TFloat, TFloat, TFloat]:
    """linear_cross_entropy's chunked path (mean/sum) as one linear + cross entropy: chunking only saves memory.

    Returns (loss, grad_input, grad_linear_weight, grad_linear_bias); the gradients are the empty placeholders
    eager returns when no gradient is needed (an exported model runs without autograd).
    """
    del batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        raise NotImplementedError("linear_cross_entropy's precomputed gradients are not exported; export in eval mode")
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _back(_class_cross_entropy(logits, target, class_weight, reduction, ignore_index, label_smoothing), input)
    return loss, _empty_gradient(input, 2), _empty_gradient(input, 2), _empty_gradient(input, 1)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_batch_chunked_no_reduction(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    ignore_index: int = -100,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
) -> TFloat:
    """Per-sample losses [N] of linear_cross_entropy's chunked path with reduction='none'."""
    del batch_chunk_size, acc_policy, acc_dtype
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    return _back(_class_cross_entropy(logits, target, class_weight, "none", ignore_index, 0.0), input)


# --- CTC ----------------------------------------------------------------------------------------------------------
# Eager's CPU kernel (LossCTC.cpp): the forward variables alpha over the extended target (blank, l1, blank, l2, ...,
# blank; 2 * S + 1 states) in log space, one time step after another, each state the log-sum-exp of itself, the one
# before and, where the label differs from the one two before, that one, plus the step's log-probability; a sequence's
# likelihood is the sum of its last two states at its last step. Here all sequences step together in an ONNX Loop
# over time, each held at its last step once past its input length; states past a sequence's own target are
# computed but never read.
def _ints(values: Sequence[int]) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(list(values), dtype=np.int64)))


def _shift_states(alpha: ir.Value, by: int, fill: ir.Value, states: int) -> ir.Value:
    """alpha[:, s - by] at each of the `states` states s, `fill` before the first."""
    return op.Slice(op.Pad(alpha, _ints([0, by, 0, 0]), fill), _ints([0]), _ints([states]), _ints([1]))


def _log_sum_exp(terms: list[TFloat], neg_inf: TFloat) -> TFloat:
    """log(sum(exp(t - m))) + m with m the largest term (0 when all are -inf), summed left to right as eager."""
    largest = terms[0]
    for term in terms[1:]:
        largest = op.Max(largest, term)
    largest = op.Where(op.Equal(largest, neg_inf), op.CastLike(0.0, largest), largest)
    total = op.Exp(op.Sub(terms[0], largest))
    for term in terms[1:]:
        total = op.Add(total, op.Exp(op.Sub(term, largest)))
    return op.Add(op.Log(total), largest)


def _ctc_loss(
    ctx: LoweringContext,
    log_probs: TFloat,
    targets: ir.Value,
    input_lengths: ir.Value,
    target_lengths: ir.Value,
    blank: int,
    reduction: int,
    zero_infinity: bool,
) -> TFloat:
    batched = len(log_probs.shape) == 3
    if not batched:  # (T, C), one sequence: a batch of one, as eager's composite does
        log_probs = op.Unsqueeze(log_probs, _ints([1]))
    input_lengths = op.Reshape(op.Cast(input_lengths, to=INT64.dtype), _ints([-1]))
    target_lengths = op.Reshape(op.Cast(target_lengths, to=INT64.dtype), _ints([-1]))
    targets = op.Cast(targets, to=INT64.dtype)
    longest = targets.shape[-1]
    if not isinstance(longest, int):
        raise ValueError(f"ctc_loss needs a static targets length, got targets of shape {list(targets.shape)}")
    if len(targets.shape) == 1:  # concatenated targets: each sequence's from its offset, padded with the last label
        offsets = op.Sub(op.CumSum(target_lengths, _ints([0])), target_lengths)
        where = op.Add(op.Unsqueeze(offsets, _ints([1])), _ints([list(range(longest))]))
        targets = op.Gather(targets, op.Min(where, _ints([max(longest - 1, 0)])), axis=0)
    neg_inf = _const(-math.inf, log_probs)
    states = 2 * longest + 1
    position = np.arange(states)
    blank_label = op.Constant(value=ir.tensor(np.int64(blank)))
    # extended target (B, states): blank at even states, label (s - 1) / 2 at odd ones
    labels = op.Gather(targets, _ints(np.maximum((position - 1) // 2, 0)), axis=1) if longest else blank_label
    extended = op.Where(op.Constant(value=ir.tensor(position % 2 == 0)), blank_label, labels)
    extended = op.Expand(extended, op.Concat(op.Shape(input_lengths), _ints([states]), axis=0))
    # the state two before may be skipped into s where s > 1 and its label differs (never at a blank)
    before = _shift_states(extended, 2, blank_label, states)
    skips = op.And(op.Not(op.Equal(before, extended)), op.Constant(value=ir.tensor(position >= 2)))
    # log-probabilities of each state's label at every step: (T, B, states)
    steps = op.Shape(log_probs, start=0, end=1)
    emissions = op.GatherElements(
        log_probs, op.Expand(op.Unsqueeze(extended, _ints([0])), op.Concat(steps, op.Shape(extended), axis=0)), axis=2
    )
    first = op.Gather(emissions, op.Constant(value=ir.tensor(np.int64(0))), axis=0)
    reachable = op.And(
        op.Constant(value=ir.tensor(position < 2)),
        op.Or(
            op.Constant(value=ir.tensor(position == 0)),
            op.Unsqueeze(op.Greater(target_lengths, _ints([0])), _ints([1])),
        ),
    )
    alpha = op.Where(reachable, first, neg_inf)
    held_at = op.Unsqueeze(input_lengths, _ints([1]))

    def step(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        (previous,) = carried
        time = op.Add(iteration, op.Constant(value=ir.tensor(np.int64(1))))
        skipped = op.Where(skips, _shift_states(previous, 2, neg_inf, states), neg_inf)
        summed = _log_sum_exp([previous, _shift_states(previous, 1, neg_inf, states), skipped], neg_inf)
        current = op.Add(summed, op.Gather(emissions, time, axis=0))
        return op.Constant(value=ir.tensor(True)), [op.Where(op.Less(time, held_at), current, previous)]

    trips = op.Sub(op.Squeeze(steps, _ints([0])), op.Constant(value=ir.tensor(np.int64(1))))
    trips = op.Max(trips, op.Constant(value=ir.tensor(np.int64(0))))
    (alpha,) = ctx.loop(trips, op.Constant(value=ir.tensor(True)), [alpha], step, name="ctc", carried_shapes=True)
    last = op.Unsqueeze(op.Mul(target_lengths, _ints([2])), _ints([1]))
    final_blank = op.Squeeze(op.GatherElements(alpha, last, axis=1), _ints([1]))
    final_label = op.Squeeze(op.GatherElements(alpha, op.Max(op.Sub(last, _ints([1])), _ints([0])), axis=1), _ints([1]))
    with_label = _log_sum_exp([final_blank, final_label], neg_inf)
    empty_target = op.Equal(target_lengths, _ints([0]))
    loss = op.Neg(op.Where(empty_target, final_blank, with_label))
    no_input = op.Neg(op.Where(empty_target, op.CastLike(0.0, loss), neg_inf))  # -0.0 as eager's -log(1)
    loss = op.Where(op.Equal(input_lengths, _ints([0])), no_input, loss)
    if zero_infinity:
        loss = op.Where(op.Equal(loss, op.CastLike(math.inf, loss)), op.CastLike(0.0, loss), loss)
    if reduction == 1:  # mean over the batch of the loss per target label
        per_label = op.Div(loss, op.CastLike(op.Max(target_lengths, _ints([1])), loss))
        return op.ReduceMean(per_label, keepdims=False)
    if reduction == 2:
        return op.ReduceSum(loss, keepdims=False)
    return loss if batched else op.Squeeze(loss, _ints([0]))


@lowering("aten::ctc_loss.Tensor", context=True)
def ctc_loss_tensor(
    ctx: LoweringContext,
    log_probs: TFloat,
    targets: TInt,
    input_lengths: TIndex,
    target_lengths: TIndex,
    blank: int = 0,
    reduction: int = 1,
    zero_infinity: bool = False,
) -> TFloat:
    return _ctc_loss(ctx, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


@lowering("aten::ctc_loss.IntList", context=True)
def ctc_loss_int_list(
    ctx: LoweringContext,
    log_probs: TFloat,
    targets: TInt,
    input_lengths: Sequence[int],
    target_lengths: Sequence[int],
    blank: int = 0,
    reduction: int = 1,
    zero_infinity: bool = False,
) -> TFloat:
    return _ctc_loss(
        ctx, log_probs, targets, _ints(input_lengths), _ints(target_lengths), blank, reduction, zero_infinity
    )
